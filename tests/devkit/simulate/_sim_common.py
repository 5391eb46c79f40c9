"""Options shared by the simulator tests (tests recompute answers with ANSWER)."""

from regen.devkit.simulate import AnswerConfig

MODEL = "moonshotai/Kimi-K2.5"
#: answer options of the protocol simulators (tests recompute answers with these)
ANSWER = AnswerConfig(mean_tokens=40, length_sigma=1.0, tool_call_rate=0.5)
PROTOCOL_OPTIONS = {
    "mean_tokens": 40,
    "length_sigma": 1.0,
    "tool_call_rate": 0.5,
    "step_ms": 1,
    "context_length": 4096,
    # speculative: each step keeps 1-4 tokens per request (the speed model at acceptance 2.1)
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "/models/draft",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}

#: two tool declarations (one with a parameter schema, one without)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]
