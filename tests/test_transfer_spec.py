"""The transfer spec and the CLI refuse, when parsing, what would be ignored or fail later; the JSON form is unchanged."""

from __future__ import annotations

import json

import pytest

from fstream_provider.model.options import TunerOptions
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.registry import TUNER_NAMES

DEST = "fstream://127.0.0.1:9/x"
ACCEPTED = "expected one of fixed, static, dynamic, fstream, globus, adaptivecc, harp"
# the JSON fields every version so far wrote: none renamed or dropped
FIELDS = {"sources", "destination", "tuner", "cc", "p", "pp", "max_cc", "bandwidth_bps", "rtt_s",
          "target_throughput_bps", "variant", "utilisation", "band", "profile_interval_s", "sample_interval_s", "watch", "interval_s", "idle_exit_s",
          "until", "verify", "key", "secret_file", "tls_cert", "tls_key", "tls_ca", "encrypt", "pool", "block_size", "tcp_buffer", "label",
          "priority_class", "public_checksum"}


def test_json_form_keeps_every_field_and_reads_what_older_versions_wrote():
    spec = TransferSpec.from_options(["/a"], DEST, tuner="fstream", cc=4, bandwidth="1Gbit", rtt="40ms")
    data = json.loads(spec.to_json())
    assert set(data) == FIELDS
    assert TransferSpec.from_json(spec.to_json()) == spec
    older = {**data, "bandwidth_bps": 1000000000, "rtt_s": 0.04}  # ints
    assert TransferSpec.from_json(json.dumps(older)) == spec
    before_harp = {k: v for k, v in data.items() if k not in ("tcp_buffer", "pool", "priority_class",
                                                              "public_checksum")}  # before #10, #11, #17
    assert TransferSpec.from_json(json.dumps(before_harp)) == spec and spec.tcp_buffer is None and not spec.pool


def test_a_deadline_round_trips_and_a_job_without_one_is_stored_as_before():
    """Issue 27: the deadline's fields appear only when given, so an agent older than them still takes the job."""
    plain = json.loads(TransferSpec.from_options(["/a"], DEST, tuner="fstream").to_json())
    assert "deadline" not in plain and "on_deadline_risk" not in plain
    spec = TransferSpec.from_options(["/a"], DEST, tuner="fstream", deadline="2026-11-26T18:00",
                                     on_deadline_risk="fail")
    assert spec.deadline == 1795716000.0 and TransferSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="deadline 'soon': expected an ISO-8601 time"):
        TransferSpec.from_options(["/a"], DEST, tuner="fstream", deadline="soon")
    with pytest.raises(ValueError, match="deadline: tuner 'static' cannot hold a target"):
        TransferSpec.from_options(["/a"], DEST, tuner="static", deadline=1795716000.0)
    with pytest.raises(ValueError, match="deadline and target_throughput: give one"):
        TransferSpec.from_options(["/a"], DEST, tuner="fstream", deadline="1h", target_throughput="1Gbit")
    with pytest.raises(ValueError, match="on_deadline_risk 'panic': must be one of warn, fail"):
        TransferSpec.from_options(["/a"], DEST, tuner="fstream", deadline="1h", on_deadline_risk="panic")


def test_an_unknown_tuner_is_refused_naming_it_and_the_accepted_ones():
    assert TransferSpec.from_options(["/a"], DEST, tuner="harp").tuner == "harp"  # built (issue #10)
    for name in ("harpoon", "nope"):
        with pytest.raises(ValueError, match=f"unknown tuner '{name}': {ACCEPTED}"):
            TransferSpec.from_options(["/a"], DEST, tuner=name)


def test_layout_and_target_are_refused_where_the_tuner_would_ignore_them():
    with pytest.raises(ValueError, match=r"tuner 'globus' takes no cc/p/pp \(got cc=4, pp=2\)"):
        TransferSpec.from_options(["/a"], DEST, tuner="globus", cc=4, pp=2)
    with pytest.raises(ValueError, match="tuner 'static' cannot hold a target throughput; only 'fstream' can"):
        TransferSpec.from_options(["/a"], DEST, tuner="static", target_throughput="800Mbps")
    with pytest.raises(ValueError, match="cc 40: more than max_cc 32"):
        TransferSpec.from_options(["/a"], DEST, tuner="fstream", cc=40)
    spec = TransferSpec.from_options(["/a"], DEST, tuner="adaptivecc", cc=3, p=2, pp=1)
    assert (spec.cc, spec.p, spec.pp) == (3, 2, 1)


def test_priority_class_is_interactive_or_batch_and_named_when_wrong():
    assert TransferSpec.from_options(["/a"], DEST).priority_class == "interactive"
    assert TransferSpec.from_options(["/a"], DEST, priority_class="batch").priority_class == "batch"
    with pytest.raises(ValueError, match="priority_class 'low': must be one of interactive, batch"):
        TransferSpec.from_options(["/a"], DEST, priority_class="low")


def test_block_size_text_is_parsed_or_refused_by_name_never_a_type_error():
    assert TransferSpec.from_options(["/a"], DEST, block_size="4MiB").block_size == 4 * 2**20
    with pytest.raises(ValueError, match="block_size '4MiB': input should be a valid integer"):
        TransferSpec(sources=["/a"], destination=DEST, block_size="4MiB")
    with pytest.raises(ValueError, match="block_size 1024: must be between 4 KiB and 64 MiB"):
        TransferSpec.from_options(["/a"], DEST, block_size=1024)


def test_tuner_options_name_the_key_the_value_and_what_is_accepted():
    assert TunerOptions.check({"block_size": "4MiB", "profile_interval": "5s"}).as_options() == {
        "block_size": 4 * 2**20, "profile_interval": 5.0}
    with pytest.raises(ValueError, match=r"tuner_options: block_size '4 bananas': expected a size between 4KiB "
                                         r"and 64MiB"):
        TunerOptions.check({"block_size": "4 bananas"})
    with pytest.raises(ValueError, match=r"tuner_options: unknown key\(s\) blocksize \(accepted: profile_interval, "
                                         r"sample_interval, block_size"):
        TunerOptions.check({"blocksize": "4MiB"})
    with pytest.raises(ValueError, match="tuner_options: cc has its own parameter; pass cc= instead"):
        TunerOptions.check({"cc": 4}, own_parameters=("cc",))
    with pytest.raises(ValueError, match="tuner_options: encrypt 'yes': input should be a valid boolean"):
        TunerOptions.check({"encrypt": "yes"})


# -- the CLI: refused while parsing, before any connection --------------------------------------
def _parse(*argv: str):
    from transfer_agent.cli.main import build_parser

    return build_parser().parse_args(["send", "/a", "--to", DEST, "--secret-file", "/dev/null", *argv])


def test_cli_tuner_choices_are_the_registry(capsys):
    args = _parse("--tuner", "adaptivecc", "--cc", "3", "--p", "2", "--pp", "1", "--block-size", "1MiB")
    from transfer_agent.cli.options import spec_from_args

    spec = spec_from_args(args)
    assert (spec.tuner, spec.cc, spec.p, spec.pp, spec.block_size) == ("adaptivecc", 3, 2, 1, 2**20)
    assert spec_from_args(_parse("--tuner", "harp", "--tcp-buffer", "1MiB")).tcp_buffer == 2**20
    assert spec_from_args(_parse("--priority", "batch")).priority_class == "batch"
    with pytest.raises(SystemExit):
        _parse("--tuner", "harpoon")
    err = capsys.readouterr().err
    assert "invalid choice: 'harpoon'" in err and all(n in err for n in TUNER_NAMES) and "harp" in TUNER_NAMES


@pytest.mark.parametrize("argv, says", [
    (("--priority-class", "batch"), "unrecognized arguments: --priority-class"),
    (("--priority", "low"), "--priority: invalid choice: 'low'"),
    (("--block-size", "4bananas"), "--block-size: size '4bananas'"),
])
def test_cli_refuses_retired_and_malformed_options_when_parsing(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        _parse(*argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_cli_refuses_a_starting_point_the_tuner_would_ignore_before_connecting(capsys, tmp_path):
    from transfer_agent.cli.main import main

    code = main(["send", str(tmp_path), "--to", DEST, "--secret-file", "/dev/null", "--tuner", "dynamic",
                 "--cc", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "fstream send: error: transfer spec: tuner 'dynamic' takes no cc/p/pp (got cc=8)" in err


# -- every tuner against every tuning option (issue 26 item 7) ----------------------------------
# What each tuner does with an option, read from the tuners (not from the registry's flags): an option
# outside its set is refused by name. ``max_cc``, ``bandwidth``, ``rtt``, ``tcp_buffer`` and
# ``sample_interval`` are not in the table: the sender uses them whatever the tuner (the channel cap, the
# path recorded in the transfer history, the interval records), so every tuner takes them.
TUNING_OPTIONS = {"cc": 4, "p": 2, "pp": 2, "target_throughput": "500Mbps", "variant": None,
                  "utilisation": 0.8, "band": 0.1, "profile_interval": "5s"}
TAKES = {
    "fixed": {"cc", "p", "pp"},
    "static": {"profile_interval"},
    "dynamic": {"profile_interval"},
    "fstream": set(TUNING_OPTIONS),
    "globus": set(),
    "adaptivecc": {"cc", "p", "pp", "profile_interval"},
    "harp": {"variant", "profile_interval"},
}
# what a refusal says about the option (after "tuner 'NAME' ")
REFUSAL = {"cc": "takes no cc/p/pp (got cc=4)", "p": "takes no cc/p/pp (got p=2)", "pp": "takes no cc/p/pp (got pp=2)",
           "target_throughput": "cannot hold a target throughput", "variant": "has no variants",
           "utilisation": "takes no utilisation or band", "band": "takes no utilisation or band",
           "profile_interval": "takes no profile_interval (--profile-interval)"}


def test_the_table_covers_every_tuner():
    assert set(TAKES) == set(TUNER_NAMES)


@pytest.mark.parametrize("name", TUNER_NAMES)
@pytest.mark.parametrize("option", TUNING_OPTIONS)
def test_every_tuner_takes_an_option_it_uses_and_refuses_one_it_would_ignore_naming_both(name, option):
    value = TUNING_OPTIONS[option]
    if option == "variant":
        value = {"fstream": "thesis", "harp": "paper"}.get(name, "default")
    if name in TAKES and option in TAKES[name]:
        spec = TransferSpec.from_options(["/a"], DEST, tuner=name, **{option: value})
        assert TransferSpec.from_json(spec.to_json()) == spec
        return
    with pytest.raises(ValueError) as e:
        TransferSpec.from_options(["/a"], DEST, tuner=name, **{option: value})
    assert f"tuner {name!r} {REFUSAL[option]}" in str(e.value)


@pytest.mark.parametrize("name", TUNER_NAMES)
def test_options_the_sender_uses_whatever_the_tuner_are_taken_by_every_tuner(name):
    spec = TransferSpec.from_options(["/a"], DEST, tuner=name, max_cc=8, bandwidth="1Gbit", rtt="40ms",
                                     tcp_buffer="1MiB", sample_interval="0.5s")
    assert (spec.max_cc, spec.bandwidth_bps, spec.rtt_s, spec.tcp_buffer, spec.sample_interval_s) == (
        8, 1e9, 0.04, 2**20, 0.5)


def test_profile_interval_refusal_says_why_and_which_tuners_take_it():
    with pytest.raises(ValueError) as e:
        TransferSpec.from_options(["/a"], DEST, tuner="fixed", profile_interval="10s")
    assert str(e.value) == (
        "transfer spec: tuner 'fixed' takes no profile_interval (--profile-interval): it keeps the given cc/p/pp "
        "for the whole transfer and never looks at a measurement; only 'static', 'dynamic', 'fstream', "
        "'adaptivecc', 'harp' can change their settings between arrivals of files, at that interval")


def test_a_stored_job_with_an_interval_its_tuner_ignored_still_reads_without_it():
    # written before the refusal: the interval changed nothing for fixed, so dropping it changes nothing
    spec = TransferSpec.from_options(["/a"], DEST, tuner="fixed", cc=3)
    stored = {**json.loads(spec.to_json()), "profile_interval_s": 5.0}
    assert TransferSpec.from_json(json.dumps(stored)) == spec
    taker = TransferSpec.from_options(["/a"], DEST, tuner="static", profile_interval="5s")
    assert TransferSpec.from_json(taker.to_json()).profile_interval_s == 5.0  # kept where it is used


def test_cli_refuses_a_profile_interval_the_tuner_would_ignore_before_connecting(capsys, tmp_path):
    from transfer_agent.cli.main import main

    code = main(["send", str(tmp_path), "--to", DEST, "--secret-file", "/dev/null", "--tuner", "fixed",
                 "--profile-interval", "10s"])
    err = capsys.readouterr().err
    assert code == 2 and "fstream send: error: transfer spec: tuner 'fixed' takes no profile_interval" in err
