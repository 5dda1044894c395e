"""The composition: ThunderAgent's admission, Continuum's ordering and pins,
Crossflow's borrowing, wired as one policy."""

from __future__ import annotations

from policy_helpers import info, signals

from basin.policy.base import Admission
from basin.policy.composition import CompositionPolicy
from basin.policy.continuum import PINNED_OFFSET
from basin.policy.registry import make_policy


def test_registered_and_declares_borrowing():
    p = make_policy("composition", crossflow={"chunk_charge_s": 0.02})
    assert isinstance(p, CompositionPolicy)
    assert p.needs.decode_runs_prefill and p.needs.extra["borrow"]["chunk_charge_s"] == 0.02


def test_admission_is_thunderagents_and_ordering_is_continuums():
    p = CompositionPolicy()
    d = p.control(signals(0.0), [])
    assert d.order_by_priority and d.next_tick_s == 5.0
    assert p.on_session_arrival(info(1, 10.0, 150_000), signals(10.0)) is Admission.ADMIT
    p.on_call_issued(1, 150_000, 10.0)
    assert p.on_session_arrival(info(2, 20.0, 60_000), signals(20.0)) is Admission.PARK  # over 200K
    assert p.priority_key(1) == 10.0
    ttl = p.on_call_finished(1, 151_000, False, 30.0)
    assert ttl == 2.0
    p.on_call_issued(1, 151_500, 31.0)
    assert p.priority_key(1) == 10.0 - PINNED_OFFSET


def test_a_pinned_program_counts_undecayed_in_the_resume_view():
    p = CompositionPolicy()
    p.control(signals(0.0), [])
    p.on_session_arrival(info(1, 0.0, 100_000), signals(0.0))
    p.on_call_issued(1, 100_000, 0.0)
    p.on_call_finished(1, 100_000, False, 10.0)          # pinned until 12 s
    room_pinned = p.admission.remaining(11.5, view="resume")
    room_after = p.admission.remaining(13.0, view="resume")
    assert room_pinned == 200_000 - 100_000 - 100
    assert room_after > 200_000 - 100_000  # the pin lapsed: the ACTING weight decays


def test_pausing_a_program_drops_its_pin_from_the_ledger():
    p = CompositionPolicy()
    p.control(signals(0.0), [])
    for uid, tok in ((1, 120_000), (2, 70_000)):
        p.on_session_arrival(info(uid, 0.0, tok), signals(0.0))
        p.on_call_issued(uid, tok, 0.0)
    p.on_call_finished(1, 125_000, False, 1.0)   # pinned, ACTING
    p.on_call_finished(2, 80_000, False, 1.0)    # pinned, ACTING: 205.2K > 200K
    d = p.control(signals(2.0), [])
    assert d.pause == (2,) and d.order_by_priority
    assert p.admission.programs[2].resident_until < 0
