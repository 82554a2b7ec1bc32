"""``bench/distill.py``'s statistics and configurations, without training: the paired t interval over
seeds, the ratios, the plot, and that only the distillation arm has a teacher."""

from __future__ import annotations

import json
import math
from pathlib import Path

import distill
from rich.console import Console
from scipy.stats import t as student_t


def _runs() -> tuple[distill.Settings, dict[str, list[distill.Curve]], distill.Curve]:
    s = distill.Settings(steps=2, seeds=3, eval_tasks=16)
    runs = {
        "grpo": [
            distill.Curve(accuracy=a)
            for a in ([0.25, 0.25, 0.3125], [0.25, 0.3125, 0.3125], [0.25, 0.25, 0.25])
        ],
        "distill": [
            distill.Curve(accuracy=a, teacher_kl=[0.2, 0.1])
            for a in ([0.25, 0.375, 0.5], [0.25, 0.4375, 0.4375], [0.25, 0.3125, 0.375])
        ],
    }
    return s, runs, distill.Curve(accuracy=[0.25, 0.5])


def test_the_paired_difference_and_the_ratios(tmp_path: Path) -> None:
    s, runs, teacher = _runs()
    gaps = [0.5 - 0.3125, 0.4375 - 0.3125, 0.375 - 0.25]
    mean = sum(gaps) / 3
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / 2)
    found = distill.paired(runs["grpo"], runs["distill"], 2)
    assert math.isclose(found.value, mean)
    assert math.isclose(found.high - found.value, student_t.ppf(0.975, 2) * sd / math.sqrt(3))
    console = Console(record=True, width=160)
    result = distill.report(s, runs, teacher, console)
    ratios = result["ratios"]
    assert math.isclose(ratios["final_ratio"], (1.3125 / 3) / (0.875 / 3))
    assert math.isclose(ratios["gap_closed_distill"], (1.3125 / 3 - 0.25) / 0.25)
    text = console.export_text()
    assert "distill − GRPO (paired)" in text and "0.146 [0.056, 0.235]" in text
    json.dumps(result)  # distill.json holds all of it
    distill.plot(s, runs, teacher, tmp_path / "d.png")
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"


def test_only_the_distillation_arm_has_a_teacher(tmp_path: Path) -> None:
    s = distill.Settings()
    (tmp_path / "grpo-seed0").mkdir()
    (tmp_path / "grpo-seed0" / "pool.db").write_text("an earlier run")
    grpo = distill.student_config(tmp_path, s, "grpo", 0, "http://127.0.0.1:9")
    assert grpo.training.distill is None and not (tmp_path / "grpo-seed0").exists()  # never resumed
    student = distill.student_config(tmp_path, s, "distill", 0, "http://127.0.0.1:9")
    assert student.training.distill is not None
    assert (student.training.distill.teacher_url, student.training.distill.mode) == (
        "http://127.0.0.1:9",
        "pure",
    )
    assert student.training.batch.batch_size == s.tasks and student.training.trainer.lora is not None
    teacher = distill.teacher_config(tmp_path / "t", tmp_path)
    assert not teacher.training.enabled and teacher.model == str(tmp_path / "t")
