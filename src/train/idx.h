/*
 * The IDX reader: MNIST-style image and label files (Fashion-MNIST by default), gzipped or not.
 *
 * A data set is a pair of files in one directory, named as the original distribution names
 * them: train-images-idx3-ubyte / train-labels-idx1-ubyte for the training set and
 * t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte for the test set, each either with a .gz
 * suffix (tried first, as the Debian package dataset-fashion-mnist ships them) or without
 * (as after gunzip). zlib reads both compressed and plain bytes, whatever the name says.
 *
 * The files are checked strictly, since a silently misread data set only shows up as a
 * mysteriously bad accuracy much later:
 *   - magic 0x00000803 (unsigned byte, 3 dimensions) for images, 0x00000801 for labels;
 *   - images at most SUMO__IDX_MAX_DIM x SUMO__IDX_MAX_DIM, at least 1 x 1 (28 x 28 for
 *     Fashion-MNIST, but any size is accepted), at most SUMO__IDX_MAX_ITEMS items, the same
 *     count in both files;
 *   - labels in 0 .. SUMO__IDX_CLASSES - 1;
 *   - exactly the bytes the header announces: a short file is an error, and so is any byte
 *     after the last item (trailing data means the header and the data disagree, so neither
 *     can be trusted); a damaged gzip stream (bad CRC, cut short) is an error too.
 * Memory follows the bytes actually read, not the header: a corrupt count cannot make the
 * reader allocate more than about twice the size of the data the file really holds.
 *
 * Errors return SUMO_ERR_SYSTEM when a file cannot be opened or read (the OS said no) and
 * SUMO_ERR_INVALID_ARGUMENT when its content is wrong, with a sentence naming the file and
 * the problem written into the caller's err buffer (always NUL-terminated when errlen > 0;
 * err may be NULL). Nothing is kept between calls, so loads may run on several threads.
 */
#ifndef SUMO_TRAIN_IDX_H
#define SUMO_TRAIN_IDX_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SUMO__IDX_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define SUMO__IDX_MAGIC_IMAGES 0x00000803u
#define SUMO__IDX_MAGIC_LABELS 0x00000801u
#define SUMO__IDX_CLASSES 10
#define SUMO__IDX_MAX_DIM 4096
#define SUMO__IDX_MAX_ITEMS 100000000u

typedef struct sumo__dataset {
    size_t n;         /* items */
    int rows, cols;   /* pixels per image: rows x cols, row-major */
    /* n * rows * cols pixels, item after item, scaled to [0, 1] as pixel / 255 (what
     * torchvision's ToTensor does; no mean/std normalisation, so the numbers are the file's) */
    float *images;
    uint8_t *labels;  /* n labels in 0 .. SUMO__IDX_CLASSES - 1 */
} sumo__dataset;

/*
 * Loads the training (train = true, 60000 items for Fashion-MNIST) or test set (10000 items)
 * from dir (NULL: SUMO__IDX_DEFAULT_DIR) into *out, which is zeroed on failure. Free with
 * sumo__dataset_free.
 */
sumo_result sumo__dataset_load(const char *dir, bool train, sumo__dataset *out, char *err,
                               size_t errlen);

/* As sumo__dataset_load, from an explicit pair of files (each gzipped or not). */
sumo_result sumo__dataset_load_files(const char *images_path, const char *labels_path,
                                     sumo__dataset *out, char *err, size_t errlen);

/* Frees what a load allocated and zeroes *ds; NULL and a zeroed dataset are fine. */
void sumo__dataset_free(sumo__dataset *ds);

#endif
