"""Math template: AIME 2024/2025 and GSM8K problems, one boxed answer checked with math-verify."""
