"""Layer 8: running compiled programs on a fabric. Today its only backend is the bit-exact
fast model (:mod:`.fastmodel`); the board and RTL backends come here (docs/architecture.md)."""
