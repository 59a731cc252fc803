"""Processes that join a running store job (init(store=..., join=True)): the tickets they take,
the members' count of them at each commit, and the larger communicator the members make with
them (grow). A module because joining is the one way into a job besides its start, with a
protocol of its own in the store.
"""
from datetime import timedelta

from .._lib import SumoError
from ._membership import (_STORE_ROOT, _ACROSS, _STORE_TRANSPORTS, store_across,
                          _make_member, _adopt_member, alive_prefix, replace_comm,
                          membership_prefix, _forget)
from ._runtime import state, error_for
from ._stores import store_adapter


# Through the store's keys under key_root: a joiner takes a ticket (the store's atomic add on
# join/tickets) and waits for join/<ticket>; at each commit() rank 0 reads how many tickets
# were handed out and every member learns it (elastic.State.check_host_updates); when some are
# new, every member raises HostsUpdatedInterrupt, rank 0 writes each new ticket's place (its
# rank, the new size, the memberships so far, the tickets taken in, the key prefix, the
# transport, the members' number: across hosts the joiners watch the members' heartbeats
# while they meet), and the members and the joiners make the larger communicator together,
# the members keeping their ranks. A ticket is taken in once, whether its holder comes or not: one
# that does not come makes the making time out on the members, who then shrink back to
# themselves. Only a torch.distributed.Store has the atomic add; sumo's directory store has not.

_TICKETS = "join/tickets"
_CLOSED = "join/closed"


def _join_store():
    """The torch.distributed.Store joiners meet the members in, or None (no store job, or a
    store without add)."""
    if state.key_root != _STORE_ROOT or state.store is None:
        return None
    return state.store.store


def join_tickets():
    """Rank 0: the join tickets handed out so far (state.admitted where no one can join);
    the others' answer is not read."""
    store = _join_store()
    if state.rank != 0 or store is None:
        return state.admitted
    return int(store.add(_STORE_ROOT + _TICKETS, 0))


def grow(tickets):
    """Every member, after HostsUpdatedInterrupt: the communicator made again with the holders
    of the tickets after state.admitted up to `tickets`, ranked after the members in ticket
    order. A PeerLost when the making fails (a joiner or a member did not come): the members'
    old communicator is still theirs to shrink."""
    store = _join_store()
    new = tickets - state.admitted
    if store is None or new <= 0:
        return
    first, size = state.admitted + 1, state.size + new
    prefix = membership_prefix("grow")
    state.admitted = tickets
    if state.rank == 0:
        for k in range(new):
            store.set(_STORE_ROOT + "join/%d" % (first + k), "%d %d %d %d %s %s %d" % (
                state.size + k, size, state.memberships + 1, tickets, prefix, state.transport,
                state.size))
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
        raise RuntimeError("sumo.torch.init: store key %s holds %r, not a joiner's place as "
                           "rank 0 writes it" % (key, record[:120]))
    return rank, size, memberships, admitted, prefix, over, members


def _init_join(store):
    """A process joining the job on `store`: a ticket, then its place once the members are at
    a commit, then the larger communicator with them."""
    adapter = store_adapter(store)
    if adapter.store is None:
        adapter.close()
        raise ValueError("sumo.torch.init: join=True needs a torch.distributed.Store (its atomic "
                         "add hands out the tickets); sumo's directory store has set and get only")
    torch_store = adapter.store
    ticket = int(torch_store.add(_STORE_ROOT + _TICKETS, 1))
    key = _STORE_ROOT + "join/%d" % ticket
    # The members take joiners in at their next commit, which may be a while: wait in slices,
    # and give up once the job has ended (rank 0's shutdown says so).
    while True:
        try:
            torch_store.wait([key], timedelta(seconds=1))
            break
        except RuntimeError:  # the slice passed (torch 2.x: DistStoreError, a RuntimeError)
            if torch_store.add(_STORE_ROOT + _CLOSED, 0):
                adapter.close()
                raise RuntimeError("sumo.torch.init: the job on this store ended before "
                                   "taking in join ticket %d" % ticket) from None
    rank, size, memberships, admitted, prefix, over, members = \
        _place(bytes(torch_store.get(key)), key)
    state.store = adapter
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
    store = _join_store()
    if store is not None and state.rank == 0:
        try:
            store.add(_STORE_ROOT + _CLOSED, 1)
        except Exception:  # leaving anyway: a store already gone has no one waiting on it
            pass
