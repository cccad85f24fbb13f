"""Layer 6: fabric layers (:mod:`.layer`), tiling, layout and instruction emission
(:mod:`.program`), dependency tokens and the cycle model (:mod:`.fastmodel`). Imports ir ...
cpu of sw/ and only :mod:`dnnfab.hw.spec` / :mod:`dnnfab.hw.config` of hw/
(docs/architecture.md)."""
