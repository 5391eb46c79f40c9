import collections

import pytest
from pydantic import ValidationError

from regen.core.errors import ConfigError
from regen.devkit.simulate.faults import Fault, FaultConfig, parse_sequence


def test_rates_are_kept_over_many_keys():
    cfg = FaultConfig(fail_rate=0.1, rate_limit_rate=0.2, disconnect_rate=0.05, stall_rate=0.05)
    n = 20_000
    got = collections.Counter(cfg.decide(f"k{i}", 0) for i in range(n))
    for fault, rate in [
        (Fault.FAIL, 0.1),
        (Fault.RATE_LIMIT, 0.2),
        (Fault.DISCONNECT, 0.05),
        (Fault.STALL, 0.05),
        (None, 0.6),
    ]:
        assert abs(got[fault] / n - rate) < 0.015, (fault, got)


def test_decisions_are_seeded_and_per_attempt():
    a = FaultConfig(fail_rate=0.5, fault_seed=1)
    b = FaultConfig(fail_rate=0.5, fault_seed=2)
    draws_a = [a.decide("key", i) for i in range(3)]
    assert draws_a == [a.decide("key", i) for i in range(3)]
    keys = [f"k{i}" for i in range(200)]
    assert [a.decide(k, 0) for k in keys] != [b.decide(k, 0) for k in keys]
    assert [a.decide(k, 0) for k in keys] != [a.decide(k, 1) for k in keys]


def test_only_the_first_attempts_can_fault():
    always = FaultConfig(fail_rate=1.0, faulty_attempts=2)
    assert [always.decide("k", i) for i in range(4)] == [Fault.FAIL, Fault.FAIL, None, None]
    forever = FaultConfig(fail_rate=1.0, faulty_attempts=-1)
    assert all(forever.decide("k", i) is Fault.FAIL for i in range(50))


def test_sequence_overrides_rates():
    seq = parse_sequence("429, 500,ok,disconnect,stall,503,retract,abort")
    assert seq == (Fault.RATE_LIMIT, Fault.FAIL, None, Fault.DISCONNECT, Fault.STALL,
                   Fault.OVERLOAD, Fault.RETRACT, Fault.ABORT)  # fmt: skip
    cfg = FaultConfig(fault_sequence=seq, fail_rate=1.0)
    assert [cfg.decide("any", i) for i in range(9)] == [*seq, None]
    assert FaultConfig(fault_sequence="503,ok").fault_sequence == (Fault.OVERLOAD, None)
    with pytest.raises(ConfigError) as info:
        parse_sequence("504")
    assert info.value.field == "fault_sequence"


def test_rates_must_fit():
    with pytest.raises(ValidationError):
        FaultConfig(fail_rate=0.6, stall_rate=0.6)
    with pytest.raises(ValidationError):
        FaultConfig(fail_rate=0.1, typo_rate=0.1)
    assert not FaultConfig().active and FaultConfig().decide("k", 0) is None
