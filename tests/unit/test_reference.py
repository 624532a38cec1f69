"""The generated reference (resnet8ptq/reference.py, issue 64 item 2): the pages in docs/reference/ are what
the code gives now (edit a field's comment or the schema and this fails until `python -m
resnet8ptq.reference` writes them again), every setting has a description, and a field's description is read
from the comments beside it, above a run of fields, an attribute docstring or its class's docstring."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from resnet8ptq import reference


@pytest.mark.parametrize("page", list(reference.PAGES), ids=lambda page: page.name)
def test_the_reference_pages_are_what_the_code_gives(page) -> None:
    assert page.read_text() == reference.PAGES[page](), f"python -m resnet8ptq.reference writes {page.name}"


def test_every_setting_is_described_and_listed_once() -> None:
    found = list(reference.settings())
    keys = [setting.key for setting in found]
    assert len(keys) == len(set(keys))
    assert {"device.adc_bits", "components.adc_model", "algo.brecq_iterations", "mlflow.tracking_uri"} <= set(
        keys
    )
    assert [setting.key for setting in found if not setting.description] == []


@dataclass
class _Example:
    """``documented``: from the docstring; ``commented``: not this, the comment wins."""

    # a block above
    first: int = 1
    second: int = 2  # its own
    third: int = 3

    fourth: int = 4
    documented: str = "x"
    commented: str = "y"  # the comment
    attribute: float = 0.5
    """An attribute docstring."""


def test_descriptions_come_from_comments_docstrings_and_blocks() -> None:
    described = reference._comments(_Example)
    assert described["first"] == "a block above"
    assert described["second"] == "its own"
    assert "third" not in described  # the block stops at a field with its own comment
    assert "fourth" not in described  # and at a blank line
    assert described["documented"] == "from the docstring"
    assert described["commented"] == "the comment"
    assert described["attribute"] == "An attribute docstring."
