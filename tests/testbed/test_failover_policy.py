"""The one failover policy (testbed/failover.py) both backends follow."""

from __future__ import annotations

from controller.job import RankPorts
from testbed.failover import Host, epoch_job_id, pick_spare, resume_iteration, take_over

FREE = [Host(9, 0, 3, (17,)), Host(8, 1, 1, (16,)), Host(7, 0, 2, (15,)), Host(6, 0, 1, (14,))]


def test_a_spare_on_the_failed_server_goes_first_then_the_lowest_id_on_the_rail() -> None:
    assert pick_spare(FREE, rail=0, failed_server=1) == Host(6, 0, 1, (14,))
    assert pick_spare(FREE, rail=0, failed_server=5) == Host(6, 0, 1, (14,))  # lowest id
    assert pick_spare(FREE[:3], rail=0, failed_server=3) == Host(9, 0, 3, (17,))
    assert pick_spare(FREE, rail=1, failed_server=3) == Host(8, 1, 1, (16,))  # its rail only
    assert pick_spare(FREE, rail=2, failed_server=0) is None


def test_a_takeover_moves_only_the_failed_rank_to_the_spare_ports() -> None:
    ports = {0: RankPorts(0, 0, (1,)), 1: RankPorts(1, 0, (2,))}
    failed = Host(1, 0, 0, (2,))
    takeover = take_over(ports, 1, failed, FREE)
    assert takeover is not None
    assert takeover.ports == {0: ports[0], 1: RankPorts(1, 0, (14,))}  # host 6, rail 0
    assert ports[1] == RankPorts(1, 0, (2,))  # the caller's ports are left as they were
    assert takeover.event() == {"rank": 1, "host": 6, "failed_host": 1, "rail": 0,
                                "old_ports": [2], "new_ports": [14], "same_server": False}
    assert take_over(ports, 1, failed, [h for h in FREE if h.rail != 0]) is None


def test_the_job_resumes_from_the_first_iteration_some_rank_did_not_complete() -> None:
    assert resume_iteration([3, 2, 4]) == 2
    assert epoch_job_id("j", 2) == "j-e2"
