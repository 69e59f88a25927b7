"""The fabric runner's rank-0 bookkeeping on a real c10d TCPStore over loopback (no cluster):
heartbeat checks of many ranks in one store round trip, lost-rank agreement through the shared
lost log, and the roster closed from the join log."""

import datetime
import time

import pytest

from trainctl.health.fabric import runner

SILENCE_S = 0.3


@pytest.fixture
def server():
    store = runner.dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10),
                                 wait_for_workers=False)
    yield store


def watch_of(server, rank: int) -> runner.PeerWatch:
    identity = runner.Identity(rank, 100, f"node{rank}", "127.0.0.1", server.port)
    return runner.PeerWatch(identity, SILENCE_S, 10)


class CountingStore:
    """Forwards to a store and counts the calls (each one is a round trip to rank 0)."""

    def __init__(self, store):
        self.store, self.calls = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def counted(*args):
            self.calls += 1
            return method(*args)
        return counted


def test_one_heartbeat_check_of_many_ranks_is_one_round_trip(server):
    ranks = list(range(1, 100))
    for rank in ranks:
        server.add(f"alive/{rank}", 1)
    watch = watch_of(server, 0)
    watch.store = CountingStore(watch.store)
    assert watch.check_many(ranks, "barrier x") == {}
    assert watch.store.calls == 1


def test_a_silent_rank_is_lost_and_every_rank_agrees_why(server):
    for rank in (1, 2):
        server.add(f"alive/{rank}", 1)
    master, other = watch_of(server, 0), watch_of(server, 3)
    assert master.check_many([1, 2], "barrier round0.0") == {}
    deadline = time.monotonic() + SILENCE_S * 10
    while time.monotonic() < deadline and not master.check_many([1, 2], "barrier round0.0"):
        server.add("alive/2", 1)  # rank 2 beats, rank 1 is silent
        time.sleep(0.05)
    why = f"no heartbeat for {SILENCE_S:g} s during barrier round0.0 (died or hung)"
    assert master.check_many([1, 2], "later") == {1: why}
    # another rank that never watched rank 1 learns it from the lost log, with the same reason
    assert other.check(1, "pair round1/0-1") == why
    assert other.check(2, "pair round1/2-3") is None


def test_the_roster_is_who_wrote_to_the_join_log_by_the_deadline(server):
    for rank in (0, 1, 3):
        server.append(runner.JOIN_LOG, f"{rank}\tnode{rank}\n")
    roster = runner._close_roster(server, 4, runner.Deadline(0.2))
    assert roster == {"joined": [0, 1, 3], "missing": [2], "hosts": {"0": "node0", "1": "node1", "3": "node3"}}


def test_a_pair_session_meets_on_the_store_its_first_rank_hosts_not_on_rank_0s(server):
    identity = runner.Identity(3, 100, "node3", "127.0.0.1", server.port)
    hosted = runner.host_pair_store(identity, 10)
    address, _, port = hosted.address.rpartition(":")
    assert address == "127.0.0.1" and int(port) not in (0, server.port)   # the route to rank 0 leaves from loopback
    keys_at_rank_0 = server.num_keys()
    session_side = runner._PairSession.open_store(hosted.address, 10)
    session_side.set("round0/3-4/0", "ready")
    assert hosted.store.get("round0/3-4/0") == b"ready"
    assert server.num_keys() == keys_at_rank_0
