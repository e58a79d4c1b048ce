"""RunConfig's typed-output fields: validated, and carried through JSON by import path."""

from __future__ import annotations

import enum

import attrs
import pytest

from loopctl import ConfigError, RunConfig
from loopctl.records import Run, json_form


@attrs.frozen
class Verdict:
    """A module-level answer type: importable, so it survives JSON."""

    ok: bool
    reason: str


class Colour(enum.Enum):
    RED = "red"


def test_an_importable_answer_type_travels_by_its_import_path() -> None:
    config = RunConfig(output_type=Verdict, output_retries=1, output_mode="tool")
    data = config.to_dict()
    assert data["output_type"] == {"ref": f"{__name__}:Verdict"}
    back = RunConfig.from_dict(data)
    assert back.output_type is Verdict and back.output_retries == 1 and back.output_mode == "tool"


def test_a_schema_dict_travels_as_itself_and_a_local_class_as_none() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert RunConfig.from_dict(RunConfig(output_type=schema).to_dict()).output_type == schema

    @attrs.frozen
    class Local:
        n: int

    assert RunConfig.from_dict(RunConfig(output_type=Local).to_dict()).output_type is None


def test_a_plain_config_keeps_its_old_dict_form() -> None:
    assert "output_type" not in RunConfig().to_dict()


@pytest.mark.parametrize(("field", "value"), [("output_retries", -1), ("output_mode", "json"), ("output_retries", True)])
def test_bad_typed_output_settings_are_refused_naming_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        RunConfig(**{field: value})  # type: ignore[arg-type]
    assert repr(value) in str(info.value)


def test_an_answer_is_recorded_in_its_json_form() -> None:
    run = Run("r1", "q", output='{"ok": true}', output_value=[Verdict(True, "fine"), Colour.RED])
    data = run.to_dict()
    assert data["output_value"] == [{"ok": True, "reason": "fine"}, "red"]
    assert Run.from_dict(data).output_value == [{"ok": True, "reason": "fine"}, "red"]
    assert json_form(None) is None
