"""Helpers of the retimed-block proofs (tests/hw/test_retimed*.py).

A *retimed* block computes, in registers, a signal that has a simple plain definition (a
count, a flag, a compare, a select); the registered form is meant to equal the plain one
on every reachable state, usually under a stated condition. The proofs here run the real
block (its own ``elaborate``, never a re-implementation) in the Amaranth simulator next to
a plain Python model, and check the two every cycle:

* :func:`edge_cover` turns a finite model (states, allowed inputs, next state) into one
  input sequence that takes every (reachable state, allowed input) pair at least once.
  When the model's state determines every register of the block (checked each cycle,
  and :func:`registers` lists the block's registers so a test can show none is left
  out), covering every edge once proves the block equal to the model on all reachable
  states: the block is deterministic, so from a given register state and input it does
  what the walk observed.
* :func:`find` / :func:`signals` look up a block's internal signals by name in the
  elaborated fragment (the simulator runs that same fragment), for blocks written inline
  in a large ``elaborate`` (monitors in tests/hw/test_retimed_engines.py).
* :func:`mutant` builds a copy of a function or class from its source with one
  expression replaced: the old, wrong definitions, to show each proof can fail.

Imported by name: tests/hw/conftest.py puts tests/hw on sys.path (it is not a package).
"""

from collections import deque
import inspect
import sys
import textwrap

from amaranth.hdl import Elaboratable, Fragment, Module, Signal, Value
from amaranth.sim import Simulator

__all__ = ["elaborate", "signals", "find", "finder", "origin", "registers", "edge_cover", "simulate", "mutant",
           "therm", "Driver", "cone", "source_locals"]


#: ``_TokenCounter``'s ``ge2`` now, and before 636dedf (it missed count == 3 with no
#: decrement pending: the deadlock of issue 15)
GE2_NOW = "(c[2:] != 0) | (c == 3) | ((c == 2) & ~dec_d)"
GE2_OLD = "(c[2:] != 0) | ((c == 2) & ~dec_d) | ((c == 3) & dec_d)"


def elaborate(dut):
    """The fragment of ``dut`` (elaborated once: its signals are the ones simulated)."""
    return Fragment.get(dut, None)


def _walk(frag, path=()):
    yield path, frag
    for sub, name, _ in frag.subfragments:
        yield from _walk(sub, path + (name or "?",))


def signals(frag):
    """``{(path, name): [(domain, Signal), ...]}`` of every driven signal in ``frag``'s
    tree (names need not be unique: a list per name)."""
    out = {}
    for path, f in _walk(frag):
        for dom, stmts in f.statements.items():
            for s in stmts:
                for sig in s._lhs_signals():
                    lst = out.setdefault((path, sig.name), [])
                    if all(x is not sig for _, x in lst):
                        lst.append((dom, sig))
    return out


def find(frag, name, path=None, index=None, domain=None):
    """The driven signal called ``name`` (in subfragment ``path``, a tuple of names, if
    given; driven from ``domain``, if given); exactly one must match. ``index``: a
    :func:`signals` result to reuse."""
    index = signals(frag) if index is None else index
    hits = [sig for (p, n), lst in index.items() if n == name and (path is None or p == tuple(path))
            for dom, sig in lst if domain is None or dom == domain]
    hits = list({id(s): s for s in hits}.values())
    assert len(hits) == 1, f"{len(hits)} signals named {name!r} (path {path}, domain {domain})"
    return hits[0]


def finder(frag):
    """``find`` bound to ``frag`` with its signal index built once."""
    index = signals(frag)
    return lambda name, path=None, domain=None: find(frag, name, path, index, domain)


def registers(frag):
    """Names of the signals driven from the ``sync`` domain (the block's registers;
    memories are not listed: their contents are checked through their read ports)."""
    return {(p, n) for (p, n), lst in signals(frag).items() if any(dom == "sync" for dom, _ in lst)}


def edge_cover(init, inputs, step, limit=1_000_000):
    """A walk through a finite model taking every reachable (state, input) edge.

    ``inputs(state)`` lists the inputs allowed in ``state`` (the block's contract),
    ``step(state, inp)`` is the next state. Returns ``(walk, states, edges)``: ``walk`` a
    list of inputs starting from ``init``; ``states``/``edges`` the reachable counts.
    """
    adj = {}
    todo = deque([init])
    while todo:
        s = todo.popleft()
        if s in adj:
            continue
        adj[s] = [(i, step(s, i)) for i in inputs(s)]
        assert len(adj) < limit
        todo.extend(t for _, t in adj[s] if t not in adj)
    uncovered = {s: set(range(len(e))) for s, e in adj.items() if e}
    n_edges = sum(len(e) for e in adj.values())
    walk, cur = [], init
    while uncovered:
        if cur in uncovered:
            k = min(uncovered[cur])
            uncovered[cur].discard(k)
            if not uncovered[cur]:
                del uncovered[cur]
            i, cur = adj[cur][k]
            walk.append(i)
            continue
        # shortest path to the nearest state with an edge not yet taken
        prev = {cur: None}
        q = deque([cur])
        goal = None
        while q:
            s = q.popleft()
            if s in uncovered:
                goal = s
                break
            for k, (i, t) in enumerate(adj[s]):
                if t not in prev:
                    prev[t] = (s, i)
                    q.append(t)
        assert goal is not None, "model graph is not strongly connected from here"
        path = []
        s = goal
        while prev[s] is not None:
            s, i = prev[s]
            path.append(i)
        walk.extend(reversed(path))
        cur = goal
    return walk, len(adj), n_edges


def simulate(frag, bench, period=1e-8, deadline=None, clock=True):
    """Run ``bench`` (an ``async def bench(ctx)`` testbench) on ``frag`` (``clock``:
    with the ``sync`` domain's clock; a purely combinational fragment has none)."""
    sim = Simulator(frag)
    if clock:
        sim.add_clock(period)
    sim.add_testbench(bench)
    if deadline is None:
        sim.run()
    else:
        sim.run_until(deadline)


def therm(k):
    """Thermometer code of the count ``k`` (bit i: k > i)."""
    return (1 << k) - 1


def mutant(obj, old=None, new=None, **env):
    """A copy of function or class ``obj`` built from its source with the expression text
    ``old`` (which must occur exactly once; or a list of such, with ``new`` a list)
    replaced by ``new``; it runs in a copy of its module's namespace, with the names in
    ``env`` replaced (e.g. a mutant helper class)."""
    src = textwrap.dedent(inspect.getsource(obj))
    pairs = [] if old is None else [(old, new)] if isinstance(old, str) else list(zip(old, new))
    for o, n in pairs:
        assert src.count(o) == 1, f"{o!r} occurs {src.count(o)} times in {obj.__name__}"
        src = src.replace(o, n)
    ns = dict(vars(sys.modules[obj.__module__]))
    ns.update(env)
    exec(compile(src, f"<mutant of {obj.__qualname__}>", "exec"), ns)
    return ns[obj.__name__]


def origin(frag, *path):
    """The elaboratable that produced the subfragment at ``path`` (its port attributes
    are the simulated signals)."""
    for name in path:
        frag = frag.find_subfragment(name)
    return frag.origins[0]


class Driver(Elaboratable):
    """``dut`` as submodule ``dut``, its input ``ports`` driven from one vector, so a
    testbench sets all of them with one write per cycle (each ``ctx.set`` settles the
    whole design: with a dozen inputs that was most of a large block's simulation time).

    ``d = Driver(dut, ports)``; ``frag = elaborate(d)``; ``dut_frag = d.fragment(frag)``;
    per cycle ``d.put(port, value)`` for what changed, then ``d.flush(ctx)``."""

    def __init__(self, dut, ports):
        self.dut = dut
        self.ports = [Value.cast(p) for p in ports]
        self.slices = {}
        o = 0
        for p in self.ports:
            self.slices[id(p)] = (o, len(p))
            o += len(p)
        self.vec = Signal(max(o, 1), name="tb_inputs")
        self.word = 0
        self.sent = None
        self._ids = {}

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        for p in self.ports:
            o, n = self.slices[id(p)]
            m.d.comb += p.eq(self.vec[o:o + n])
        return m

    def fragment(self, frag):
        return frag.find_subfragment("dut")

    def put(self, port, value):
        key = id(port)
        if key not in self.slices:
            key = self._ids.get(key)
            if key is None:
                v = Value.cast(port)
                match = [p for p in self.ports if p is v]
                assert len(match) == 1, f"{port!r} is not a driven port"
                key = self._ids[id(port)] = id(match[0])
        o, n = self.slices[key]
        mask = ((1 << n) - 1) << o
        self.word = (self.word & ~mask) | ((int(value) << o) & mask)

    def flush(self, ctx):
        if self.word != self.sent:
            ctx.set(self.vec, self.word)
            self.sent = self.word


def cone(frag, comb=(), sync=()):
    """The real design's own expressions, cut out of ``frag`` (top level) for an
    exhaustive check: the top-level assignments of the comb-driven signals named in
    ``comb`` are copied as they are, and for each register named in ``sync`` its
    top-level assignment's right-hand side drives a new comb signal ``<name>_next``.
    Every other signal they read becomes a free input (a *leaf*).

    Returns ``(module, outs, leaves)``: ``outs`` maps each name to the signal to read
    (the copy of a comb signal, or ``<name>_next``), ``leaves`` maps leaf names to their
    signals. A test sets the leaves, reads ``outs`` and compares with the plain
    definition; it should also assert the leaf set, so that no input is overlooked."""
    from amaranth.hdl._ast import Assign
    m = Module()
    outs, driven, reads = {}, set(), {}
    want = {**{n: "comb" for n in comb}, **{n: "sync" for n in sync}}
    found = {}
    for dom, stmts in frag.statements.items():
        for st in stmts:
            if isinstance(st, Assign) and isinstance(st.lhs, Signal) and st.lhs.name in want \
                    and want[st.lhs.name] == dom:
                assert st.lhs.name not in found, f"{st.lhs.name} assigned twice at the top level"
                found[st.lhs.name] = st
    assert set(found) == set(want), f"no top-level assignment of {set(want) - set(found)}"
    for name, st in found.items():
        if want[name] == "comb":
            m.d.comb += st.lhs.eq(st.rhs)
            outs[name] = st.lhs
            driven.add(id(st.lhs))
        else:
            nxt = Signal(st.lhs.shape(), name=f"{name}_next")
            m.d.comb += nxt.eq(st.rhs)
            outs[name] = nxt
        for sig in st.rhs._rhs_signals():
            reads[id(sig)] = sig
    leaves = {}
    for k, sig in reads.items():
        if k not in driven:
            name = sig.name
            while name in leaves:
                name += "'"
            leaves[name] = sig
    return m, outs, leaves


def source_locals(func, names, env):
    """The values of the local variables ``names`` of ``func``, from its source: the
    top-level assignments to them, executed in order in ``env`` (for layouts a block
    builds inside ``elaborate`` and does not expose)."""
    import ast
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    body = tree.body[0].body
    ns = dict(env)
    todo = set(names)
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in todo:
            exec(compile(ast.Module([node], []), "<source_locals>", "exec"), ns)
            todo.discard(node.targets[0].id)
        if not todo:
            break
    assert not todo, f"no top-level assignment of {todo} in {func.__qualname__}"
    return [ns[n] for n in names]
