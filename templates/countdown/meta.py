"""Metadata of the countdown template."""

from templates import _params
from templates._meta import ParamSpec, TemplateMeta

META = TemplateMeta(
    name="countdown",
    title="Countdown numbers game",
    description=(
        "Given a few numbers and a target, write an arithmetic expression (+ - * / and parentheses) "
        "that uses each number exactly once and equals the target, inside <answer></answer>. "
        "Puzzles are generated from a random solution expression (always solvable), seeded by index. "
        "Reward 1 for a correct expression, a small format reward for a valid expression that misses."
    ),
    keywords=(
        "countdown",
        "numbers game",
        "target number",
        "reach a target",
        "24 game",
        "arithmetic puzzle",
        "puzzle",
        "search",
        "tinyzero",
        "equation",
    ),
    reward_parts={"format_ok": "shaping", "correct": "goal"},
    reward_weights={"format_ok": "format_reward"},
    reward_patch_reason=(
        "Setting format_reward to 0 pays only a correct expression, so a well-formed wrong answer earns nothing."
    ),
    capabilities=(
        "single-turn chat",
        "write an arithmetic expression inside <answer></answer>",
        "search over combinations of numbers",
    ),
    parameters=(
        _params.data_int("n_numbers", 3, 2, 6, "How many numbers each puzzle gives.", counts="numbers"),
        _params.data_int("max_number", 20, 2, 100, "Given numbers are drawn from 1..max_number."),
        _params.n_tasks(512, "Number of puzzles to write."),
        _params.seed("Generator seed (puzzle i depends only on the seed, sizes and i)."),
        ParamSpec(
            name="format_reward",
            type="float",
            default=0.1,
            minimum=0.0,
            maximum=0.5,
            description="Reward for a valid expression that uses the numbers but misses the target.",
        ),
        _params.max_tokens(256, 16_384),
        _params.temperature(),
    ),
)
