"""Upstream ThunderAgent's token estimate from the length of a request's payload.

Before every request upstream's router (ThunderAgent/scheduler/router.py,
``update_program_before_request``) sizes the program as
``int(len(json.dumps(payload)) / char_to_token_ratio)``. The ratio is one for the whole router
and starts at 5.0 characters per token. At each reply that carries usage
(``update_program_after_request``) it is learned from that program's last payload length over
the prompt tokens the engine reported: the first sample replaces 5.0, later ones are blended in
as ``0.2·sample + 0.8·ratio``.
"""

from __future__ import annotations

INITIAL_CHARS_PER_TOKEN = 5.0


class LearnedCharsPerToken:
    """The router-wide characters-per-token ratio and the estimate it gives."""

    def __init__(self) -> None:
        self.ratio = INITIAL_CHARS_PER_TOKEN
        self._sampled = False

    def tokens(self, chars: int) -> int:
        return int(chars / self.ratio)

    def learn(self, chars: int, prompt_tokens: int) -> None:
        if chars <= 0 or prompt_tokens <= 0:  # upstream's guard against an empty sample
            return
        sample = chars / prompt_tokens
        self.ratio = 0.2 * sample + 0.8 * self.ratio if self._sampled else sample
        self._sampled = True
