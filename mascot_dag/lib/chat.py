"""A live conversation with the companion group (`mascot chat`): you speak, the director picks
which agent answers (and how), the agent answers with its adapter, for `agents_per_round` agents.

Reuses the dialogue engine's request builders so a chat turn is produced exactly like a
support-mode turn in Stage 2 and evaluation.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from mascot_dag.lib.dialogue import (
    DialogueConfig,
    DialogueSpec,
    _agent_request,
    _directives,
    _State,
    clean_agent_text,
)
from mascot_dag.lib.personas import PersonaCard
from mascot_dag.lib.types import ChatRequest, ChatResult, Context


class ChatSession:
    def __init__(
        self,
        roster: list[PersonaCard],
        generate: Callable[[list[ChatRequest]], list[ChatResult]],
        config: DialogueConfig,
        seed: int = 0,
    ) -> None:
        self.roster, self.generate, self.config = roster, generate, config
        self.state: _State | None = None
        self.seed = seed

    def say(self, text: str) -> list[tuple[PersonaCard, str, dict]]:
        """Add the user's turn; return [(card, reply, directive)] for this round."""
        text = " ".join(text.split())
        if not text:
            raise ValueError("empty message")
        if self.state is None:
            ctx = Context("chat", "empatheticdialogues", "emotional_support", text, text,
                          turns=[{"speaker": "speaker", "text": text}])
            spec = DialogueSpec("chat", ctx, "support", self.roster, None, self.seed, 10**6)
            self.state = _State(spec, rng=random.Random(self.seed))
        st = self.state
        st.add("user", "user", text, "human")
        replies = []
        for _ in range(self.config.agents_per_round):
            d = _directives([st], self.generate, self.config)[0]
            card = next(c for c in self.roster if c.persona_id == d["speaker"])
            idx = len(st.turns)
            res = self.generate([_agent_request(st, card, d, self.config, idx)])[0]
            reply = clean_agent_text(res.text, self.roster)
            used = self.config.persona_adapters.get(card.persona_id) or "base+prompt"
            st.add("agent", card.persona_id, reply, used)
            st.n_agent += 1
            replies.append((card, reply, d))
        return replies
