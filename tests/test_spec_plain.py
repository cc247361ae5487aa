"""``fstream send``'s spec checked without pydantic (issue 29) says what ``TransferSpec`` says, with the same values.

``spec_plain.spec_from_dict`` accepts only what the model accepts and hands everything else to the model, so
each input here must give the same error message, or the same fields and stored form, both ways.
"""

from __future__ import annotations

import json

import pytest

from fstream_provider.model.spec import TransferSpec
from fstream_provider.model.spec_fields import SpecFields
from fstream_provider.model.spec_plain import FIELDS, PlainSpec, spec_from_dict, spec_from_options
from fstream_provider.model.validation import SpecError

D = "fstream://h:9/x"
GOOD = [
    {"sources": ["a"], "destination": D},
    {"sources": "a", "destination": D},  # one path
    {"sources": ("a", "b"), "destination": D},  # a tuple: the before-rule makes it a list
    {"sources": ["a"], "destination": D, "rtt_s": 1, "bandwidth_bps": 10**9},  # ints in float fields: floats
    {"sources": ["a"], "destination": D, "bandwidth_bps": float("inf")},
    {"sources": ["a"], "destination": D, "tuner": "fixed", "cc": 2, "p": 3, "pp": 0, "max_cc": 2},
    {"sources": ["a"], "destination": D, "deadline": 7, "on_deadline_risk": "fail"},
    {"sources": ["a"], "destination": D, "watch": True, "until": 5, "idle_exit_s": 1.5, "interval_s": 0.5},
    {"sources": ["a"], "destination": D, "tls_cert": "c", "tls_key": "k", "tls_ca": "a", "key": "k.1"},
    {"sources": ["a"], "destination": D, "connect_timeout_s": 3, "max_attempts": 4, "retry_for_s": 300.0},
    {"sources": ["a"], "destination": D, "variant": "thesis+jump", "utilisation": 0.5, "band": 0.2,
     "profile_interval_s": 4.0},
    {"sources": ["a"], "destination": D, "tuner": "harp", "variant": "paper", "tcp_buffer": 2**20},
    {"sources": ["a"], "destination": D, "cc": None, "label": "l", "pool": True, "priority_class": "batch"},
    {"sources": ["a"], "destination": "fstream://[::1]:9/a%20b", "block_size": 4096, "encrypt": True},
]
BAD = [
    {"sources": [], "destination": D}, {"sources": [1], "destination": D}, {"sources": ["a\x00"], "destination": D},
    {"sources": None, "destination": D}, {"sources": ["a"]}, {"destination": D},
    {"sources": ["a"], "destination": D, "cc": True}, {"sources": ["a"], "destination": D, "cc": 1.0},
    {"sources": ["a"], "destination": D, "rtt_s": "1"}, {"sources": ["a"], "destination": D, "watch": 1},
    {"sources": ["a"], "destination": D, "bogus": 1}, {"sources": ["a"], "destination": D, "bogus": 1, "cc": 0},
    {"sources": ["a"], "destination": 5}, {"sources": ["a"], "destination": "http://h:9/x"},
    {"sources": ["a"], "destination": "fstream://h:99999/x"}, {"sources": ["a"], "destination": D, "tuner": "nope"},
    {"sources": ["a"], "destination": D, "tuner": 3}, {"sources": ["a"], "destination": D, "priority_class": "urgent"},
    {"sources": ["a"], "destination": D, "block_size": 4096.0}, {"sources": ["a"], "destination": D, "block_size": 1},
    {"sources": ["a"], "destination": D, "tls_key": "k"}, {"sources": ["a"], "destination": D, "cc": 4, "max_cc": 2},
    {"sources": ["a"], "destination": D, "utilisation": float("nan")}, {"sources": ["a"], "destination": D, "key": ""},
    {"sources": ["a"], "destination": D, "tuner": "static", "cc": 2}, {"sources": ["a"], "destination": D, "p": 0},
    {"sources": ["a"], "destination": D, "tuner": "globus", "profile_interval_s": 3.0},
    {"sources": ["a"], "destination": D, "deadline": 5.0, "target_throughput_bps": 1e9},
    {"sources": ["a"], "destination": D, "tuner": "harp", "deadline": 5.0},
    {"sources": ["a"], "destination": D, "variant": "bogus"}, {"sources": ["a"], "destination": D, "max_attempts": 0},
    {"sources": ["a"], "destination": D, "on_deadline_risk": "panic"}, {"sources": ["a"], "destination": D, "rtt_s": 0},
    {"sources": ["a"], "destination": D, "tcp_buffer": 2**31}, {"sources": ["a"], "destination": D, "label": None},
]


def _fields(spec: SpecFields) -> dict:
    return {name: (repr(getattr(spec, name)), type(getattr(spec, name))) for name in FIELDS}


@pytest.mark.parametrize("data", GOOD, ids=range(len(GOOD)))
def test_what_the_model_accepts_is_checked_without_it_to_the_same_values(data):
    model, plain = TransferSpec(**data), spec_from_dict(data)
    assert isinstance(plain, PlainSpec)
    assert _fields(plain) == _fields(model)
    assert plain.to_dict() == model.to_dict() and plain.to_json() == model.to_json()
    assert plain == model and model == plain
    assert plain.dest == model.dest and plain.tuner_variant() == model.tuner_variant()
    assert TransferSpec.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("data", BAD, ids=range(len(BAD)))
def test_what_the_model_refuses_is_refused_in_its_words(data):
    with pytest.raises(SpecError) as model:
        TransferSpec(**data)
    with pytest.raises(SpecError) as plain:
        spec_from_dict(data)
    assert str(plain.value) == str(model.value)


def test_every_field_has_a_type_the_plain_check_knows_and_the_models_order():
    assert list(FIELDS) == list(TransferSpec.model_fields)
    assert all(check is not None for check, _ in FIELDS.values()), "a field type spec_plain does not know: add it"
    assert {k: d for k, (_, d) in FIELDS.items() if k not in ("sources", "destination")} == \
           {k: f.default for k, f in TransferSpec.model_fields.items() if not f.is_required()}


def test_options_and_copies_go_through_the_same_checks():
    plain = spec_from_options(["/a"], D, bandwidth="1Gbit", rtt="40ms", block_size="1MiB", tuner="fixed", cc=1)
    assert plain == TransferSpec.from_options(["/a"], D, bandwidth="1Gbit", rtt="40ms", block_size="1MiB",
                                              tuner="fixed", cc=1)
    with pytest.raises(SpecError, match=r"^transfer spec: bandwidth: rate 'fast'"):
        spec_from_options(["/a"], D, bandwidth="fast")
    assert isinstance(plain.replace(cc=2), PlainSpec) and plain.replace(cc=2).cc == 2
    with pytest.raises(SpecError, match="cc 2000: must be between 1 and 1024"):
        plain.replace(cc=2000)
    with pytest.raises(AttributeError):
        plain.cc = 2000  # read only: a change goes through replace()
    assert json.loads(plain.to_json())["block_size"] == 2**20
