"""Metadata of the math template."""

from templates import _params
from templates._meta import ParamSpec, ParamTarget, TemplateMeta

META = TemplateMeta(
    name="math",
    title="Competition and grade-school math (AIME 2024/2025, GSM8K)",
    description=(
        "Single-turn math problems answered with one \\boxed{} final answer, checked with math-verify. "
        "Datasets: AIME 2024 and 2025 (30 problems each, integer answers) and a 200-problem GSM8K test "
        "sample. Episodes report `correct`; pass@k over a group is in `passk.py`."
    ),
    keywords=(
        "math",
        "maths",
        "aime",
        "aime24",
        "aime25",
        "aime 2024",
        "aime 2025",
        "gsm8k",
        "gsm",
        "competition math",
        "word problems",
        "reasoning",
        "boxed",
        "math-verify",
        "pass@k",
    ),
    reward_parts={"format_ok": "format", "correct": "goal"},
    capabilities=(
        "single-turn chat",
        "write a final answer inside \\boxed{}",
        "multi-step arithmetic or competition-level reasoning (AIME needs a strong model)",
    ),
    parameters=(
        ParamSpec(
            name="dataset",
            type="str",
            default="gsm8k",
            choices=("gsm8k", "aime24", "aime25", "aime", "all"),
            description="Which problems to use ('aime' = 2024 and 2025; 'all' = every file).",
            target=ParamTarget.DATA,
        ),
        _params.data_int("limit", 0, 0, 100_000, "Keep only the first N problems (0 = all)."),
        _params.max_tokens(1024, 65_536, "Completion token limit per episode."),
        _params.temperature(),
        ParamSpec(
            name="max_completion_chars",
            type="int",
            default=20_000,
            minimum=1,
            maximum=1_000_000,
            description="Completions longer than this (characters) earn 0.",
        ),
    ),
)
