/*
 * The IDX reader: small files written here (gzipped and plain) must come back exactly, and
 * every kind of damage must give its own error with a message naming the file. The real
 * Fashion-MNIST files are loaded when the Debian package is installed, skipped otherwise.
 * SHOWMSG=1 in the environment prints every error message the reader produced.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "train/idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

typedef struct fixture {
    char dir[64];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (f == NULL) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/sumo_test_idx_XXXXXX");
    if (mkdtemp(f->dir) == NULL) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    char p[128];
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", f->dir, names[i]);
        unlink(p);
        snprintf(p, sizeof p, "%s/%s.gz", f->dir, names[i]);
        unlink(p);
    }
    rmdir(f->dir);
    free(f);
    return 0;
}

/* An IDX file in memory: header then data, with room to damage it afterwards. */
typedef struct blob {
    unsigned char *p;
    size_t len;
} blob;

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static blob make_idx(uint32_t magic, int ndims, const uint32_t *dims, const uint8_t *data,
                     size_t ndata)
{
    blob b;
    b.len = 4 + 4 * (size_t)ndims + ndata;
    b.p = malloc(b.len + 16);
    assert_non_null(b.p);
    put_be32(b.p, magic);
    for (int d = 0; d < ndims; d++) put_be32(b.p + 4 + 4 * d, dims[d]);
    if (ndata > 0) memcpy(b.p + 4 + 4 * ndims, data, ndata);
    return b;
}

static void path_of(const fixture *f, const char *name, bool gz, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/%s%s", f->dir, name, gz ? ".gz" : "");
    assert_true(n > 0 && (size_t)n < len);
}

/* compress: gzip the bytes; the name is the caller's (plain bytes may go under .gz). */
static void write_path(const char *p, bool compress, const blob *b)
{
    if (compress) {
        gzFile g = gzopen(p, "wb");
        assert_non_null(g);
        if (b->len > 0) assert_int_equal(gzwrite(g, b->p, (unsigned)b->len), (int)b->len);
        assert_int_equal(gzclose(g), Z_OK);
    } else {
        FILE *fp = fopen(p, "wb");
        assert_non_null(fp);
        if (b->len > 0) assert_int_equal(fwrite(b->p, 1, b->len, fp), b->len);
        assert_int_equal(fclose(fp), 0);
    }
}

static void write_file(const fixture *f, const char *name, bool gz, const blob *b)
{
    char p[128];
    path_of(f, name, gz, p, sizeof p);
    write_path(p, gz, b);
}

/* A consistent pair of n images of rows x cols, written under prefix ("train" or "t10k");
 * pixels and labels returned for comparison (caller frees). */
typedef struct pair {
    size_t n;
    uint32_t rows, cols;
    uint8_t *pixels, *labels;
    blob images, labelfile;
} pair;

static pair make_pair(size_t n, uint32_t rows, uint32_t cols)
{
    pair p = {n, rows, cols, NULL, NULL, {NULL, 0}, {NULL, 0}};
    size_t np = n * rows * cols;
    p.pixels = malloc(np + 1);
    p.labels = malloc(n + 1);
    assert_non_null(p.pixels);
    assert_non_null(p.labels);
    uint32_t s = 12345;
    for (size_t i = 0; i < np; i++) {
        s = s * 1103515245u + 12345u;
        p.pixels[i] = (uint8_t)(s >> 16);
    }
    p.pixels[0] = 0;
    if (np > 1) p.pixels[1] = 255;
    for (size_t i = 0; i < n; i++) p.labels[i] = (uint8_t)(i * 7 % 10);
    uint32_t idims[3] = {(uint32_t)n, rows, cols}, ldims[1] = {(uint32_t)n};
    p.images = make_idx(SUMO__IDX_MAGIC_IMAGES, 3, idims, p.pixels, np);
    p.labelfile = make_idx(SUMO__IDX_MAGIC_LABELS, 1, ldims, p.labels, n);
    return p;
}

static void free_pair(pair *p)
{
    free(p->pixels);
    free(p->labels);
    free(p->images.p);
    free(p->labelfile.p);
}

static void write_pair(const fixture *f, const char *prefix, bool gz, const pair *p)
{
    char in[64], ln[64];
    snprintf(in, sizeof in, "%s-images-idx3-ubyte", prefix);
    snprintf(ln, sizeof ln, "%s-labels-idx1-ubyte", prefix);
    write_file(f, in, gz, &p->images);
    write_file(f, ln, gz, &p->labelfile);
}

static void check_equal(const sumo__dataset *ds, const pair *p)
{
    assert_int_equal(ds->n, p->n);
    assert_int_equal(ds->rows, (int)p->rows);
    assert_int_equal(ds->cols, (int)p->cols);
    for (size_t i = 0; i < p->n * p->rows * p->cols; i++)
        assert_true(ds->images[i] == (float)p->pixels[i] / 255.0f);
    assert_memory_equal(ds->labels, p->labels, p->n);
}

/* Loads the train set of the fixture expecting failure r with a message naming file. */
static void expect_failure(const fixture *f, bool train, sumo_result want, const char *file,
                           const char *phrase)
{
    sumo__dataset ds;
    char err[512];
    memset(&ds, 0xab, sizeof ds);
    sumo_result r = sumo__dataset_load(f->dir, train, &ds, err, sizeof err);
    if (r != want) fail_msg("got %s, want %s (message: %s)", sumo_result_name(r),
                            sumo_result_name(want), err);
    assert_null(ds.images);
    assert_null(ds.labels);
    assert_int_equal(ds.n, 0);
    if (getenv("SHOWMSG")) print_message("  %s\n", err);
    if (strstr(err, file) == NULL) fail_msg("message does not name %s: %s", file, err);
    if (phrase != NULL && strstr(err, phrase) == NULL)
        fail_msg("message lacks \"%s\": %s", phrase, err);
    sumo__dataset_free(&ds);
}

/* ---------------------------------------------------------------------------------------- */

static void test_roundtrip_gzip(void **state)
{
    fixture *f = *state;
    pair p = make_pair(7, 3, 5);
    write_pair(f, "train", true, &p);
    sumo__dataset ds;
    char err[256] = "untouched";
    assert_int_equal(sumo__dataset_load(f->dir, true, &ds, err, sizeof err), SUMO_SUCCESS);
    assert_string_equal(err, "");
    check_equal(&ds, &p);
    assert_true(ds.images[0] == 0.0f && ds.images[1] == 1.0f);
    sumo__dataset_free(&ds);
    assert_null(ds.images);
    sumo__dataset_free(&ds); /* twice is fine */
    free_pair(&p);
}

static void test_roundtrip_plain(void **state)
{
    fixture *f = *state;
    pair p = make_pair(4, 28, 28);
    write_pair(f, "t10k", false, &p); /* gunzipped names */
    sumo__dataset ds;
    char err[256];
    assert_int_equal(sumo__dataset_load(f->dir, false, &ds, err, sizeof err), SUMO_SUCCESS);
    check_equal(&ds, &p);
    sumo__dataset_free(&ds);
    free_pair(&p);
}

/* Plain bytes under a .gz name (zlib passes them through), and the explicit-path entry. */
static void test_plain_under_gz_name(void **state)
{
    fixture *f = *state;
    pair p = make_pair(3, 2, 9);
    char in[128], ln[128];
    path_of(f, "x-images", false, in, sizeof in);
    path_of(f, "x-labels", false, ln, sizeof ln);
    write_path(in, false, &p.images);
    write_path(ln, false, &p.labelfile);
    sumo__dataset ds;
    char err[256];
    assert_int_equal(sumo__dataset_load_files(in, ln, &ds, err, sizeof err), SUMO_SUCCESS);
    check_equal(&ds, &p);
    sumo__dataset_free(&ds);
    path_of(f, "train-images-idx3-ubyte", true, in, sizeof in);
    path_of(f, "train-labels-idx1-ubyte", true, ln, sizeof ln);
    write_path(in, false, &p.images);
    write_path(ln, false, &p.labelfile);
    assert_int_equal(sumo__dataset_load(f->dir, true, &ds, err, sizeof err), SUMO_SUCCESS);
    check_equal(&ds, &p);
    sumo__dataset_free(&ds);
    path_of(f, "x-images", false, in, sizeof in);
    path_of(f, "x-labels", false, ln, sizeof ln);
    unlink(in);
    unlink(ln);
    free_pair(&p);
}

static void test_zero_items(void **state)
{
    fixture *f = *state;
    pair p = make_pair(0, 28, 28);
    write_pair(f, "train", true, &p);
    sumo__dataset ds;
    assert_int_equal(sumo__dataset_load(f->dir, true, &ds, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(ds.n, 0);
    assert_int_equal(ds.rows, 28);
    sumo__dataset_free(&ds);
    free_pair(&p);
}

static void test_missing_file(void **state)
{
    fixture *f = *state;
    expect_failure(f, true, SUMO_ERR_SYSTEM, "train-labels-idx1-ubyte.gz", "no such file");
    /* Labels present, images missing. */
    pair p = make_pair(2, 4, 4);
    write_file(f, "train-labels-idx1-ubyte", true, &p.labelfile);
    expect_failure(f, true, SUMO_ERR_SYSTEM, "train-images-idx3-ubyte", "no such file");
    free_pair(&p);
    /* A directory that does not exist. */
    sumo__dataset ds;
    char err[256];
    assert_int_equal(sumo__dataset_load("/nonexistent/sumo-dir", true, &ds, err, sizeof err),
                     SUMO_ERR_SYSTEM);
    assert_non_null(strstr(err, "/nonexistent/sumo-dir/train-labels-idx1-ubyte"));
}

static void test_truncated(void **state)
{
    fixture *f = *state;
    for (int gz = 0; gz < 2; gz++) {
        pair p = make_pair(5, 6, 6);
        p.images.len -= 1; /* one pixel short */
        write_pair(f, "train", gz, &p);
        expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte",
                       "truncated");
        /* Header cut in the middle of the dimensions. */
        p.images.len = 9;
        write_file(f, "train-images-idx3-ubyte", gz, &p.images);
        expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte",
                       "truncated");
        /* Empty labels file. */
        p.labelfile.len = 0;
        write_file(f, "train-labels-idx1-ubyte", gz, &p.labelfile);
        expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-labels-idx1-ubyte",
                       "truncated");
        free_pair(&p);
    }
}

/* A gzip stream cut short and one with a damaged CRC: zlib's complaint, with the file name. */
static void test_damaged_gzip(void **state)
{
    fixture *f = *state;
    pair p = make_pair(50, 10, 10);
    write_pair(f, "train", true, &p);
    char path[128];
    path_of(f, "train-images-idx3-ubyte", true, path, sizeof path);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    unsigned char buf[8192];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    assert_true(len > 40 && len < sizeof buf);

    fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(buf, 1, len - 12, fp); /* lose the trailer and some data */
    fclose(fp);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "truncated");

    buf[len - 8] ^= 0x5a; /* CRC32 of the trailer */
    fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(buf, 1, len, fp);
    fclose(fp);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "corrupt");
    free_pair(&p);
}

static void test_wrong_magic(void **state)
{
    fixture *f = *state;
    pair p = make_pair(3, 4, 4);
    /* The two files swapped: each has the other's magic. */
    write_file(f, "train-images-idx3-ubyte", true, &p.labelfile);
    write_file(f, "train-labels-idx1-ubyte", true, &p.images);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-labels-idx1-ubyte.gz",
                   "wrong magic number 0x00000803");
    write_file(f, "train-labels-idx1-ubyte", true, &p.labelfile);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "a label file where images were expected");
    /* Not an IDX file at all. */
    blob junk = {(unsigned char *)"hello, world\n", 13};
    write_file(f, "train-images-idx3-ubyte", true, &junk);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz", "magic");
    free_pair(&p);
}

static void test_count_mismatch(void **state)
{
    fixture *f = *state;
    pair p = make_pair(5, 4, 4), q = make_pair(4, 4, 4);
    write_file(f, "train-images-idx3-ubyte", true, &p.images);
    write_file(f, "train-labels-idx1-ubyte", true, &q.labelfile);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "5 images");
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-labels-idx1-ubyte.gz",
                   "4 labels");
    free_pair(&p);
    free_pair(&q);
}

static void test_label_out_of_range(void **state)
{
    fixture *f = *state;
    pair p = make_pair(6, 4, 4);
    p.labelfile.p[8 + 3] = 10;
    write_pair(f, "train", true, &p);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-labels-idx1-ubyte.gz",
                   "label 10 of item 3");
    free_pair(&p);
}

static void test_trailing_data(void **state)
{
    fixture *f = *state;
    pair p = make_pair(3, 4, 4);
    p.labelfile.p[p.labelfile.len++] = 0; /* one byte more than announced */
    write_pair(f, "train", false, &p);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-labels-idx1-ubyte",
                   "trailing data: 1 extra byte");
    free_pair(&p);
}

/* Headers that promise absurd sizes fail on the cap or on the missing data, cheaply. */
static void test_lying_header(void **state)
{
    fixture *f = *state;
    pair p = make_pair(2, 4, 4);
    write_file(f, "train-labels-idx1-ubyte", true, &p.labelfile);

    uint32_t huge[3] = {0xffffffffu, 28, 28};
    blob b = make_idx(SUMO__IDX_MAGIC_IMAGES, 3, huge, NULL, 0);
    write_file(f, "train-images-idx3-ubyte", true, &b);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "dimension 0 is 4294967295");
    free(b.p);

    uint32_t zero[3] = {2, 0, 28};
    b = make_idx(SUMO__IDX_MAGIC_IMAGES, 3, zero, NULL, 0);
    write_file(f, "train-images-idx3-ubyte", true, &b);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "dimension 1 is 0");
    free(b.p);

    /* Within the caps (~1.6 TB announced) but with 32 bytes of data: a truncation error,
     * and the reader must not have tried to reserve the announced size (ASan would fail). */
    uint32_t big[3] = {SUMO__IDX_MAX_ITEMS, SUMO__IDX_MAX_DIM, SUMO__IDX_MAX_DIM};
    uint8_t some[32] = {0};
    b = make_idx(SUMO__IDX_MAGIC_IMAGES, 3, big, some, sizeof some);
    write_file(f, "train-images-idx3-ubyte", true, &b);
    expect_failure(f, true, SUMO_ERR_INVALID_ARGUMENT, "train-images-idx3-ubyte.gz",
                   "file holds only 32");
    free(b.p);
    free_pair(&p);
}

/* Messages fit whatever buffer is given, and a NULL buffer is fine. */
static void test_error_buffer(void **state)
{
    fixture *f = *state;
    sumo__dataset ds;
    char small[8];
    memset(small, 'x', sizeof small);
    assert_int_equal(sumo__dataset_load(f->dir, true, &ds, small, sizeof small),
                     SUMO_ERR_SYSTEM);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(sumo__dataset_load(f->dir, true, &ds, NULL, 0), SUMO_ERR_SYSTEM);
    assert_int_equal(sumo__dataset_load(f->dir, true, NULL, NULL, 0),
                     SUMO_ERR_INVALID_ARGUMENT);
    sumo__dataset_free(NULL);
}

static void check_real(bool train, size_t want_n)
{
    sumo__dataset ds;
    char err[512];
    sumo_result r = sumo__dataset_load(NULL, train, &ds, err, sizeof err);
    if (r != SUMO_SUCCESS) fail_msg("%s", err);
    assert_int_equal(ds.n, want_n);
    assert_int_equal(ds.rows, 28);
    assert_int_equal(ds.cols, 28);
    size_t count[SUMO__IDX_CLASSES] = {0};
    for (size_t i = 0; i < ds.n; i++) count[ds.labels[i]]++;
    for (int c = 0; c < SUMO__IDX_CLASSES; c++) assert_int_equal(count[c], want_n / 10);
    float lo = 1.0f, hi = 0.0f;
    double sum = 0.0;
    for (size_t i = 0; i < ds.n * 784; i++) {
        lo = ds.images[i] < lo ? ds.images[i] : lo;
        hi = ds.images[i] > hi ? ds.images[i] : hi;
        sum += ds.images[i];
    }
    assert_true(lo == 0.0f && hi == 1.0f);
    /* Fashion-MNIST's mean pixel is about 0.286 (the value torchvision examples use). */
    double mean = sum / (double)(ds.n * 784);
    assert_true(mean > 0.27 && mean < 0.30);
    sumo__dataset_free(&ds);
}

static void test_real_fashion_mnist(void **state)
{
    (void)state;
    if (access(SUMO__IDX_DEFAULT_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        print_message("skipping: %s not installed (apt-get install dataset-fashion-mnist)\n",
                      SUMO__IDX_DEFAULT_DIR);
        skip();
    }
    check_real(true, 60000);
    check_real(false, 10000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_gzip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_plain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_under_gz_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_items, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_gzip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_magic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_label_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trailing_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lying_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_buffer, setup, teardown),
        cmocka_unit_test(test_real_fashion_mnist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
