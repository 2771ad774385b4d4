"""FailurePlan: validation and the order of failures."""

import pytest

from pyflink_aisp.chaos import FailurePlan
from pyflink_aisp.errors import ConfigError


def test_schedule_alternates_kills_and_spreads_broker_restarts():
    assert FailurePlan(taskmanager_kills=3, broker_restarts=1).schedule() == ["tm+workers", "broker", "tm",
                                                                           "tm+workers"]
    kinds = FailurePlan(records=3000, taskmanager_kills=20, broker_restarts=3).schedule()
    assert kinds.count("broker") == 3 and kinds.count("tm") == 10 and kinds.count("tm+workers") == 10
    assert kinds[0] != "broker" and kinds[-1] != "broker"
    assert [i for i, k in enumerate(kinds) if k == "broker"] == [5, 11, 17]
    assert FailurePlan(taskmanager_kills=0, broker_restarts=1).schedule() == ["broker"]


@pytest.mark.parametrize("kwargs, message", [
    ({"taskmanager_kills": 0, "broker_restarts": 0}, "need at least one failure"),
    ({"taskmanager_kills": -1}, "need at least one failure"),
    ({"records": 4}, "records must be > the 4 failures"),
    ({"checkpoint_interval_ms": 50}, "checkpoint_interval_ms must be >= 100"),
    ({"pause_s": 0}, "the times positive"),
])
def test_invalid_plans_are_one_clear_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        FailurePlan(**kwargs)
