"""The pinned-digest check (tests/integration/pinned.py) fails on a digest edited by one character, naming
the digest, the configuration and the machine, and passes on the pinned values themselves."""

from __future__ import annotations

import pytest

from resnet8ptq.hardware import Hardware
from tests.integration import pinned

MACHINE = Hardware("Intel Xeon", ("avx2", "avx512_vnni", "amx_int8"), 2)


@pytest.mark.parametrize("configuration", list(pinned.PINNED))
def test_the_pinned_values_pass(configuration: str) -> None:
    pinned.check(configuration, pinned.PINNED[configuration], MACHINE)


@pytest.mark.parametrize("configuration", list(pinned.PINNED))
def test_one_edited_character_fails_naming_digest_configuration_and_machine(configuration: str) -> None:
    found = dict(pinned.PINNED[configuration])
    tag, value = next(iter(found.items()))
    found[tag] = value[:-1] + ("0" if value[-1] != "0" else "1")
    with pytest.raises(AssertionError) as failure:
        pinned.check(configuration, found, MACHINE)
    message = str(failure.value)
    assert f"{tag} {found[tag]} (pinned {value})" in message
    assert message.startswith(f"{configuration} ({pinned.CONFIGURATIONS[configuration]})")
    assert MACHINE.label in message and all(kind in message for kind in pinned.CONFIRMED_ON)
    assert message.count("(pinned ") == 1  # only the edited one


def test_a_missing_digest_fails() -> None:
    found = {k: v for k, v in pinned.PINNED["crossbar"].items() if k != "digest.device_predictions"}
    with pytest.raises(AssertionError, match=r"digest\.device_predictions missing"):
        pinned.check("crossbar", found, None)


def test_every_configuration_says_how_it_is_made() -> None:
    assert set(pinned.PINNED) == set(pinned.CONFIGURATIONS)
    assert all(len(v) == 16 for digests in pinned.PINNED.values() for v in digests.values())
