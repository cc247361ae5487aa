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
          "until", "verify", "secret_file", "tls_cert", "tls_key", "tls_ca", "encrypt", "pool", "block_size", "tcp_buffer", "label",
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
