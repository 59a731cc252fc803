"""Processes that join a running store job (init(store=..., join=True)): the tickets they take,
the members' count of them at each commit, and the larger communicator the members make with
them (grow). A module because joining is the one way into a job besides its start, with a
protocol of its own in the store.
"""
import ctypes

from .. import _lib
from .._abi import SUMO_SUCCESS, SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT
from .._lib import lib, SumoError
from ._membership import (_STORE_ROOT, _ACROSS, _STORE_TRANSPORTS, store_across,
                          _make_member, _adopt_member, alive_prefix, replace_comm,
                          membership_prefix, _forget)
from ._runtime import state, error_for
from ._stores import store_adapter


# Through libsumo's join tickets (sumo_ticket_take and its kin, sumo_elastic.h) under
# key_root: a joiner takes a ticket and waits for its place; at each commit() rank 0 counts
# the tickets taken and every member learns it (elastic.State.check_host_updates); when some
# are new, every member raises HostsUpdatedInterrupt, rank 0 writes each new ticket's place
# (its rank, the new size, the memberships so far, the tickets taken in, the key prefix, the
# transport, the members' number: across hosts the joiners watch the members' heartbeats
# while they meet), and the members and the joiners make the larger communicator together,
# the members keeping their ranks. A ticket is taken in once, whether its holder comes or not:
# one that does not come makes the making time out on the members, who then shrink back to
# themselves.

# A joiner waits for its place in slices of this many seconds (the members take joiners in
# at their next commit, which may be a while).
_WAIT_SLICE_S = 1.0


def _tickets(adapter, call, what, *args):
    """One of libsumo's ticket calls on the job's store; SumoError naming what failed."""
    err = ctypes.create_string_buffer(256)
    code = call(adapter.pointer(), _STORE_ROOT.encode(), *args, err, len(err))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "%s: %s" % (what, err.value.decode(errors="replace")))


def _joinable():
    """Whether processes can join this job: a store job's with a torch.distributed.Store."""
    return (state.key_root == _STORE_ROOT and state.store is not None
            and state.store.store is not None)


def join_tickets():
    """Rank 0: the join tickets taken so far (state.admitted where no one can join); the
    others' answer is not read."""
    if state.rank != 0 or not _joinable():
        return state.admitted
    count = ctypes.c_int()
    _tickets(state.store, lib.sumo_tickets_count, "counting the join tickets", state.admitted,
             ctypes.byref(count))
    return count.value


def grow(tickets):
    """Every member, after HostsUpdatedInterrupt: the communicator made again with the holders
    of the tickets after state.admitted up to `tickets`, ranked after the members in ticket
    order. A PeerLost when the making fails (a joiner or a member did not come): the members'
    old communicator is still theirs to shrink."""
    new = tickets - state.admitted
    if not _joinable() or new <= 0:
        return
    first, size = state.admitted + 1, state.size + new
    prefix = membership_prefix("grow")
    state.admitted = tickets
    if state.rank == 0:
        for k in range(new):
            _tickets(state.store, lib.sumo_ticket_place, "writing join ticket %d's place" % (first + k),
                     first + k, ("%d %d %d %d %s %s %d" % (
                         state.size + k, size, state.memberships + 1, tickets, prefix,
                         state.transport, state.size)).encode())
    # The members keep their ranks and beat; the joiners do not yet.
    alive = (alive_prefix(), list(range(state.size)) + [-1] * new) if store_across() else None
    try:
        comm = _make_member(state.transport, prefix, state.rank, size,
                            "the store (processes joining)", alive)
    except SumoError as e:
        raise error_for(e.code, "making the communicator with %d joining process%s: %s"
                        % (new, "" if new == 1 else "es", e)) from None
    beats, old_size = alive_prefix(), state.size
    replace_comm(comm, state.rank, size)
    if store_across():
        _forget(beats, old_size, [])


# The most ranks a communicator holds (sumo_elastic.h's agreement: 1024).
_MAX_RANKS = 1024


def _place(record, key):
    """A joiner's place as rank 0 wrote it, every field bounded before use: the store is
    anyone's who reaches it (docs/security.md), so a record of another shape is refused."""
    try:
        fields = record.decode("ascii").split()
        rank, size, memberships, admitted, members = (int(f) for f in
                                                       (fields[0], fields[1], fields[2],
                                                        fields[3], fields[6]))
        prefix, over = fields[4], fields[5]
        ok = (len(fields) == 7 and 0 < size <= _MAX_RANKS and 0 < members <= rank < size
              and memberships > 0 and admitted > 0 and over in _STORE_TRANSPORTS
              and len(prefix) <= 200)
    except (UnicodeDecodeError, ValueError, IndexError):
        ok = False
    if not ok:
        raise RuntimeError("sumo.torch.init: %s holds %r, not a joiner's place as "
                           "rank 0 writes it" % (key, record[:120]))
    return rank, size, memberships, admitted, prefix, over, members


def _init_join(store):
    """A process joining the job on `store`: a ticket, then its place once the members are at
    a commit, then the larger communicator with them."""
    adapter = store_adapter(store)
    if adapter.store is None:
        adapter.close()
        raise ValueError("sumo.torch.init: join=True needs a torch.distributed.Store (the "
                         "jobs that take joiners); a job on sumo's directory store takes none")
    ticket = ctypes.c_int()
    place = ctypes.create_string_buffer(256)
    try:
        _tickets(adapter, lib.sumo_ticket_take, "sumo.torch.init: taking a join ticket",
                 ctypes.byref(ticket))
        # The members take joiners in at their next commit, which may be a while: wait in
        # slices (an interrupt is seen between them) until the place comes or the job has
        # ended (rank 0's shutdown closes it).
        while True:
            try:
                _tickets(adapter, lib.sumo_ticket_wait, "join ticket %d" % ticket.value,
                         ticket.value, _WAIT_SLICE_S, place, len(place))
                break
            except SumoError as e:
                if e.code == SUMO_ERR_TIMEOUT:
                    continue
                if e.code == SUMO_ERR_PEER_FAILURE:
                    raise RuntimeError("sumo.torch.init: the job on this store ended before "
                                       "taking in join ticket %d" % ticket.value) from None
                raise
    except BaseException:
        adapter.close()
        raise
    state.store = adapter
    rank, size, memberships, admitted, prefix, over, members = \
        _place(place.value, "the place of join ticket %d" % ticket.value)
    state.key_root = _STORE_ROOT
    # The members beat under the membership before the one made now, each at its rank.
    alive = None
    if over in _ACROSS:
        alive = ("%sm%d/alive/" % (_STORE_ROOT, int(memberships) - 1),
                 [r if r < int(members) else -1 for r in range(int(size))])
    comm = _make_member(over, prefix, int(rank), int(size), "the store (joining)", alive)
    state.memberships, state.admitted = int(memberships), int(admitted)  # the heart's keys
    state.joined = True
    _adopt_member(comm, over, int(rank), int(size))


def _close_job():
    """Rank 0 of a store job, leaving: processes still waiting to join stop waiting."""
    if _joinable() and state.rank == 0:
        try:
            _tickets(state.store, lib.sumo_tickets_close, "closing the job to joiners")
        except Exception:  # leaving anyway: a store already gone has no one waiting on it
            pass
