"""Every diagnostic code, with its title and the explanation `cyclec explain` prints.

Codes are stable: once released, a code keeps its meaning. E0xxx are syntax,
E01xx names and files, E02xx values and shapes. E03xx, W and N codes are the design
reviewer's (`cyclelang.review`): each rule registers its own with `add`, from its
decorator, when the package is imported. docs/diagnostics.md is
generated from this table (`cyclec explain --markdown > docs/diagnostics.md`)
and a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir.kinds import BY_KEYWORD, MERGE_BY_KEYWORD


@dataclass(frozen=True)
class Code:
    code: str
    title: str
    explanation: str
    example: str = ""


CODES: dict[str, Code] = {}


def add(code: str, title: str, explanation: str, example: str = "") -> None:
    """Register a code; the design reviewer's rules register theirs from their decorators."""
    assert code not in CODES, code
    CODES[code] = Code(code, title, explanation.strip(), example.strip())


_add = add


# --- syntax --------------------------------------------------------------------------------
_add("E0001", "not UTF-8", "A spec is UTF-8 text. The byte shown could not be decoded; save the file as UTF-8.")
_add("E0002", "unexpected character", """
The character cannot start any token. Names are ASCII letters, digits and '_';
comments start with '#'. Unicode look-alikes (a fullwidth '＝', a typographic
'×' or '−') are named with their code point so they can be found.""", "chamber width＝768")
_add("E0003", "unclosed brace", "A '{' opens a block that is never closed before the end of the file. The diagnostic points at the brace that is still open.", "engine e {\n  chamber width=8")
_add("E0004", "unmatched brace", "A '}' closes a block that was never opened.", "engine e { chamber width=8 }}")
_add("E0005", "unexpected token", """
The parser met a token that cannot come here. When it is a keyword that belongs
elsewhere (a 'merge' outside a prechamber), the help line says where it belongs.""", "engine e { merge cooling }")
_add("E0006", "unknown statement", "A name stands where a statement keyword was expected; usually a misspelled keyword. The help line suggests the closest one.", "stage s { prechamer mix { turbine mlp } }")
_add("E0007", "option without a value", "An option is written `name=` with nothing after the '='. Give a value, or drop the '=' to write a flag.", "turbine mlp ratio=")
_add("E0008", "unexpected end of file", "The file ends in the middle of a statement.")
_add("E0009", "unterminated string", "A string (an include path) has no closing '\"' on its line.", 'include "blocks.cycle')
_add("E0010", "file too large", "A spec is limited to 1 MiB; a larger file is not a spec. Split it with include.")
_add("E0011", "nested too deeply", "Braces and parentheses nest at most 32 levels, and one expression at most 200 operators deep (a run of signs, a long sum); real specs nest 4 braces deep.")
_add("E0012", "name too long", "Names are at most 128 characters.")

# --- names and files ----------------------------------------------------------------------
_add("E0101", "unknown name", "A name is used that no `let`, template parameter or built-in (width, vocab, context) defines. The help line suggests a close one.", "stage block x dept { ... }")
_add("E0102", "defined twice", "Two lets, templates, stages or branches of one stage share a name. Stage and branch names become parameter names in the built model, so they must be unique where they live.")
_add("E0103", "unknown stage template", "A stage without a body names a template that is not defined (in this file or an included one).", "stage llama_blok(heads=8) x 4")
_add("E0104", "bad template arguments", "A template is instanced with an argument it does not take, without one it needs, with too many positional arguments, or with a positional argument after a named one.")
_add("E0105", "file not found", "The spec or an included file cannot be read.")
_add("E0106", "include cycle", "Files include each other in a circle; the message shows the chain.")
_add("E0107", "include outside the spec's tree", """
An include may only read files in the spec's directory or below it (or in a
directory given with --include-path). Absolute paths, '..' that climbs out, and
symbolic links that point out are all refused: a spec cannot make the compiler
read arbitrary files.""", 'include "../../etc/passwd"')
_add("E0108", "engine in an included file", "Included files hold lets and stage templates; an engine is defined only in the file that is compiled.")
_add("E0109", "more than one engine", "A spec defines one engine. Put others in their own files and share blocks with include.")
_add("E0111", "includes nest too deeply", "Includes nest at most 16 files deep.")

# --- values and shapes ---------------------------------------------------------------------
_add("E0201", "unknown option", "The option does not belong to this statement (each turbine kind takes its own). The help line suggests the closest option it does take, or lists them.", "turbine mlp heads=12")
_add("E0202", "option given twice", "An option appears twice on one statement.", "turbine attention heads=8 heads=12")
_add("E0203", "wrong kind of value", "An option got the wrong kind of value: a fraction where a whole number is needed, a number where true/false is, or a keyword that is not one of the choices.", "turbine mlp act=gelu2")
_add("E0204", "unknown kind", "The kind after a keyword is not one cyclelang knows (turbine " + "|".join(BY_KEYWORD) + ", norm layernorm|rmsnorm, merge " + "|".join(MERGE_BY_KEYWORD) + ", ...).", "turbine atention heads=12")
_add("E0205", "value out of range", "A size or count is zero or negative, a probability is outside [0, 1), a fraction outside (0, 1], or similar.", "turbine attention heads=0")
_add("E0206", "missing part", "A required option or part is missing: `chamber width=`, `feed tokens vocab= context=`, a turbine in a prechamber, a prechamber in a fullflow.")
_add("E0207", "heads do not divide the width", "Multi-head attention splits the width into equal heads, so heads must divide it (or head_dim= must be given). The help line names the nearest divisors.", "chamber width=768 ... turbine attention heads=10")
_add("E0208", "kv_heads do not divide heads", "In grouped-query attention each KV head serves an equal group of query heads, so kv_heads must divide heads.", "turbine attention heads=8 kv_heads=3")
_add("E0209", "ratio gives no whole width", "ratio x width must be a whole number of units. Give the hidden width directly with hidden= (Llama's 8/3 ratio is usually rounded to a multiple of 64 or 256).", "turbine mlp ratio=8/3 act=swiglu")
_add("E0210", "bad arithmetic", "Division by zero, a number too large to be a size (2**62 or more), a power out of range, or a result that is not a finite number.")
_add("E0211", "contradictory options", "Options that cannot hold together: ratio= with hidden=, loss= on a branch that is not overboard, a merge on an overboard branch, a sliding window on bidirectional attention.")
_add("E0212", "widths do not meet", """
A branch's exhaust must return at the chamber's width (or, for an overboard
branch with a loss, at the vocabulary's width, since it predicts tokens); a
repeated stage must end at the width it starts with.""", "prechamber p { turbine linear out=64 }")
_add("E0213", "engine part missing", "An engine needs a chamber, a feed and a nozzle.")
_add("E0214", "part given twice", "An engine has one chamber, throat, feed, nozzle and startup; a prechamber one merge; a startup one of each line.")
_add("E0260", "mup needs a normal init", "`param mup` scales the init per parameter group from the spec's std (the standard init at base_width); xavier derives its own scale from the shapes, which mup would scale a second time.", "startup { param mup init xavier }")
_add("E0215", "misplaced construct", "A construct in a place where it has no meaning: a body on a stage made from a template, arguments on an inline stage, a merge that is not last in its prechamber, a fullflow's shared norm after its branches.")
_add("E0216", "repeat count too large", "A stage repeats at most 10,000 times.")
_add("E0217", "tied head at another width", "A tied head reuses the feed's embedding matrix, so the main line must end at the chamber's width.")
_add("E0218", "bidirectional mixer in a causal engine", """
With `throat causal`, nothing may travel upstream: a position may depend only on
itself and earlier positions. An attention with mask=open would let the future
leak into the past (and make the KV cache wrong).""", "throat causal ... turbine attention heads=8 mask=open")


# --- the design reviewer (cyclelang.review) -------------------------------------------------
# E03xx: review errors; W1xx: warnings, raised to errors by `check --strict`; N1xx: notes.
# A warning or note is silenced for one line with a comment on that line: `# allow: W102`.
# Each is registered by its rule's decorator in cyclelang/review/rules_*.py (`@rule`, review/registry.py).
_add("E0284", "gated delta without a causal throat", "The gated delta rule (`turbine delta`) folds each position into a state that only later positions read: it has no bidirectional form, so an open engine cannot use it.", "throat open ... turbine delta heads=4")
_add("E0285", "k_heads do not divide heads", "In a gated delta mixer each group of heads / k_heads value heads reads one query/key head (as GQA's query heads share a KV head), so k_heads must divide heads.", "turbine delta heads=6 k_heads=4")

# --- limits (cyclelang.limits), appended ------------------------------------------------------
_add("E0230", "heads do not divide the inner width", "A linear attention splits the width, and an ssm its inner width (expand x width), into equal heads: heads must divide it, or head_dim= must be given. The help line names the nearest divisors.", "chamber width=64 ... turbine ssm heads=6 expand=2")
_add("E0231", "groups do not divide heads", "In an ssm the heads share B and C in groups (as GQA's query heads share keys and values), so groups must divide heads.", "turbine ssm heads=8 groups=3")
_add("E0232", "decay without a causal throat", "Linear attention's retention (RetNet's decay per head) weighs the past by its distance: it is defined for a causal engine only.", "throat open ... turbine linear_attention heads=4 retention")
_add("E0233", "latent attention without a rotary key", "Latent attention (`turbine attention latent=`) decouples positions into a rotary key shared by the heads; it needs an even number of rotary_dims, at least 2.", "turbine attention heads=8 latent=64 rotary_dims=3")
_add("E0234", "a stage of stages with ops of its own", """
A stage holds either stages (a nested stage, a group) or ops (prechambers,
fullflows, norms, turbines), not both: a group is a pure container whose
instances are its stages' instances in order. Put the ops in a stage of their
own inside the group.""", "stage group x 4 {\n  stage ssm_layer x 3 { prechamber mix { norm rmsnorm  turbine ssm heads=4 } }\n  norm rmsnorm\n}")
_add("E0235", "stages nested too deeply", "Stages nest at most 4 levels (engine > stage > stage > stage > stage); a deeper pattern folds into fewer levels.",
     "stage a x 2 { stage b x 2 { stage c x 2 { stage d x 2 { stage e { ... } } } } }")
_add("E0236", "a stage template that uses itself", "A template's body may hold stages made from other templates, but not from itself, directly or through others: the expansion would never end.",
     "stage pair { stage inner = pair() }")
_add("E0237", "too many stage instances", """
An engine runs at most 100,000 stage instances in all. Nested repeats multiply
(`stage a x 100 { stage b x 1000 { ... } }` runs b 100,000 times), so the limit
counts the instances a built model would hold, not the lines of the spec.""", "stage a x 1000 { stage b x 1000 { prechamber p { turbine mlp } } }")
_add("E0238", "too many repeated stages", """
An engine holds at most 256 stages that repeat (`stage s x N`), groups included: each
gets a count of its own in the generated Config, and the generated model indexes a stage
by the sum of the counts before it, so its source grows with their square (1,000 such
stages wrote 21 MB of Python). Stages used once have no such limit (only E0237's), and
no published architecture comes near it: repeat a group of stages instead.""",
     "stage s1 x 2 { ... }  stage s2 x 2 { ... }  ...  stage s257 x 2 { ... }")
_add("E0280", "option of the other ssm version", "`turbine ssm` is Mamba-2's mixer (heads, groups, a clamp on the step) by default and Mamba-1's with version=1 (one state per channel, a low-rank step dt_rank=, Jamba's dt/B/C norms). An option of one version given to the other is refused rather than ignored.", "turbine ssm version=1 heads=8")
_add("E0290", "hyper-connection option out of place", "Hyper-connections are the chamber's: `chamber width=N streams=4 connections=hyper|manifold` gives every branch a junction that reads a learned mix of the streams and writes into each. A merge of another kind in such a chamber, `merge hyper` in a chamber of one stream, `dynamic=` or `sinkhorn=` without hyper-connections, `sinkhorn=` with `connections=hyper` (it has no Sinkhorn step) and `dynamic=false` with `connections=manifold` (its weights always come from the streams) are refused.", "chamber width=64 streams=4\n  ...  prechamber mix { turbine attention heads=4  merge cooling }")
_add("E0291", "main-line op in a chamber of several streams", "In a chamber of several streams every stage holds prechambers that return, each joining the streams through its hyper-connection; the streams are summed where the stages end, before the main line's own ops (the final norm). A norm or turbine in series on the main line inside a stage, a fullflow, an overboard branch, or a stage after a main-line op has no reading for several streams, and is refused.", "chamber width=64 streams=4\n  stage block { prechamber mix { ... }  norm layernorm }")
_add("E0219", "model too large to build", """
`cyclec build` estimates the parameter count from the IR before it allocates
anything (closed form, no torch) and refuses an engine above 2,000,000,000
parameters: 8 GB of fp32 weights before a single activation, usually a typo in a
width or a repeat count. Pass --allow-large to build it anyway.""", "chamber width=65536 ... stage block x 1000 { ... }")

# --- diagrams (cyclelang.backends.graphviz), appended -----------------------------------------
_add("E0220", "too many stages to expand", """
`cyclec draw --expand` unrolls every repeated stage, one cluster per repeat. A diagram
unrolls at most 64 stages in all: past that it no longer reads on a page and its DOT
grows with the repeat count (a stage may repeat 10,000 times). Draw it folded: a
repeated stage is drawn once with a ×N badge.""", "stage block x 10000 { ... }   # cyclec draw --expand")

_add("E0275", "diagram does not fit its size", """
`cyclec draw --size slide|column|page` lays the figure out at the preset's physical size
(a 13.33 × 7.5 in slide, a 3.25 in column, a 7 × 9.2 in page) with no text under 12 pt,
and never shrinks it to fit: a shrunk figure is one nobody can read. It first tries denser
layouts, both directions and the main line wrapped into more columns; a figure that fits none
is refused with the size it needs and a way that does fit, found by laying it out (another
preset, without --rankdir, or folded). Every figure is also capped at 200 in on a side (a
long --expand).""", "cyclec draw full_flow.cycle --size column   # hint: --size page fits")
_add("E0276", "report fired at another depth or width", """
`cyclec draw --annotate fire.json` prints each stage instance's measured gradient on the
instance it belongs to. A report fired with --depth or --width (a scale model) measured
another engine: its r-th reading is not this spec's r-th instance, so it is refused
rather than half-applied. Fire the spec as drawn.""", "cyclec fire gpt2.cycle --depth 4 --json f.json; cyclec draw gpt2.cycle --annotate f.json")


# --- training (cyclelang.train, `cyclec train`), appended ---------------------------------------
_add("E0501", "data not found", "A `--data` path does not exist or cannot be read. Give text files, folders of them, or .bin/.npy token arrays.")
_add("E0502", "no data", """
A data file given by name is empty, or the --data paths hold no tokens at all (a folder
whose files are all empty or binary). In a folder, empty and binary files are skipped
and listed; a file named on the command line must hold text.""")
_add("E0503", "not text, or not a token array", """
A text data file holds a NUL byte in its first 64 KiB (it is binary, not text), or bytes
that are not UTF-8 anywhere: the message names the byte offset. Nothing is left behind
(the tokens are written to a temporary folder and renamed into place when complete).
Give UTF-8 text, or give tokens as a .npy array (1-D, integer) or a raw .bin file
(uint16 as nanoGPT writes it, or --bin-dtype).""")
_add("E0504", "tokenizer unreadable", "`--tokenizer` names neither a `tokenizers` JSON file nor a folder saved by a transformers tokenizer, or the package it needs is missing.")
_add("E0505", "tokens outside the feed's vocab", """
The tokenizer has more tokens than the spec's feed takes (`feed tokens vocab=`), or a
pre-tokenized array holds an id at or above it: the embedding would be indexed out of
range. The byte-level default needs vocab >= 256. Use a tokenizer that fits, or widen
the feed.""", "feed tokens vocab=128   # with the byte-level default (256 tokens)")
_add("E0506", "too little data", "A split (training or held-out) holds fewer tokens than one window of --seq + 1. Give more data, a smaller --seq, or another --holdout.")
_add("E0507", "bad training settings", """
A training setting is out of range: --steps, --micro-batch or --eval-batches below 1,
--seq longer than the context, a --batch-tokens that is not a whole number of
micro-steps (micro-batch x seq x data-parallel ranks), a startup override the startup
block would refuse (a negative lr, betas outside [0, 1)), or --tp or --pp without --fsdp
where data-parallel replicas remain; or parallelisms that do not compose yet, each named
with its reason: --ep with --compile, --tp and --checkpointing all together (torch's
compiled backward of the recomputed stage fails on the tensor-parallel experts).""")
_add("E0508", "run folder from another spec", """
`--resume RUN_DIR` continues a run only with the engine it was started with: the
folder's engine.json (the engine's IR without source positions) differs from what this
spec resolves to. Resume with the spec the run started from (its text is
RUN_DIR/spec.cycle, the default when SPEC is left out), or train into a new --out.""")
_add("E0509", "run folder unusable", """
`--out` already holds files (a new run never writes over an old one), or `--resume`
names a folder that is not a run, holds no complete checkpoint, was trained on other
data, or was saved with another tensor-parallel degree (its fused q/k/v rows are
regrouped per TP rank; the data-parallel size may change freely).""")
_add("E0510", "checkpoint not written", """
Writing a checkpoint failed (a full disk, a permission). A checkpoint is written into
a temporary folder and renamed into place only when complete, so the last good one is
intact and named in the message; free the space and continue with --resume.""")
_add("E0511", "flameout", """
A step's loss or gradient norm is not finite: the engine is out. The optimizer step
is not taken; the record of the step is in metrics.jsonl and the last good checkpoint
is intact. Lower --lr, lengthen --warmup, set --clip (the restrictor orifice), or
resume from the checkpoint with other settings in a new run.""")
_add("E0512", "parallelism plan refused", """
The model cannot be split as asked: tensor parallelism splits attention by whole heads
(heads and kv_heads must be divisible by --tp) and MLPs by hidden units (the hidden
width must be divisible by --tp); under --compile the MoE experts' custom op takes whole
weights; expert parallelism splits each MoE's experts (their number must be divisible by
--ep); the pipeline splits the stage instances (at least one per piece with --pp) and
cannot run yet several residual streams, --compile or --dtype fp16. Each part that
cannot be split is named with the reason.""", "turbine attention heads=6   # with --tp 4")
_add("E0513", "distributed launch needed", """--tp N splits the model over N processes: launch with `torchrun --nproc-per-node N -m cyclelang train ...`.
With --pp, --ep and --tp together the mesh is pp x ep x tp processes (times the data-parallel
copies): the number of processes must be a multiple of their product.""")

# --- transformers interop (cyclelang.interop, `cyclec import` / `cyclec export`), appended -------
_add("E0401", "config field the language cannot express", """
`cyclec import` turns a transformers checkpoint's config.json into the spec it
implies, key by key, by its `model_type`, and reads it closed-world: each family
declares the keys it maps and the keys that change nothing (ids, dtype, dropout, ...).
A key whose value the language cannot write (an activation with no counterpart,
GPT-2's attention scaled by 1/(layer + 1), clamped q/k/v) is refused by name, and so
is any other key that holds something other than transformers' default for that
class: the importer cannot tell whether it changes the function, and a spec that
dropped it would build an engine that computes something else. `null` is a value,
not an absent key. The same check refuses to load such a checkpoint.""", '"scale_attn_by_inverse_layer_idx": true')
_add("E0402", "unknown or unsupported model type", """
Interop reads a checkpoint by its config's `model_type` only (as transformers'
AutoConfig reads it: `mistral` with `layer_types` is Ministral), never by guessing
from the weights' key names (a Gemma checkpoint has Llama's key names but computes
(1 + w) norms). A decoder family that is not claimed is refused with the nearest
claimed family and what the language lacks for it, or with "only an importer is
missing" where the language can already say the whole model.""", '"model_type": "qwen3_next"')
_add("E0403", "unreadable checkpoint config", """
The source given to `cyclec import` is not a checkpoint folder with a config.json or a
config.json file; or the file is not a regular file (a FIFO or a device is refused before
a byte is read), is larger than a config can be (16 MiB), is not UTF-8, is not JSON, nests
deeper than Python reads, or is not one JSON object.""", "cyclec import weights.bin")
_add("E0404", "the spec corresponds to no transformers family", """
`cyclec export` writes a transformers config and weights only for a spec that one
family computes exactly: it writes the config and checks, field by field, that
importing it gives back the spec's function. A construct no family has (a feed
scale, a residual scale, a parallel block, a different norm per layer) is refused
with the first field that differs, in both vocabularies.""", "merge scale=0.5   # no family scales its residual")
_add("E0405", "weights that do not fit the spec", """
`cyclec export --weights` reads the compiled module's state dict (`cyclec build
--weights`); a key or a shape that the spec's module does not have is refused,
naming it, before anything is written.""", "cyclec export llama.cycle --weights gpt2.safetensors -o out/")


# --- hardening (issue 21), appended --------------------------------------------------------------
_add("E0112", "not a regular file", """
A spec, an included file, `--data`, `--annotate` or a weights file must be a regular
file. A FIFO (named pipe) would block the compiler forever waiting for a writer, a
device such as /dev/zero would be read without end, and a directory or socket holds
no text. The file kind is checked before a byte is read.""", "cyclec check /dev/zero")
_add("E0113", "includes too large in all", """
Each included file is read once (a second include of the same file adds nothing), and
a spec with its includes reads at most 256 files and 4 MiB of text in all. A tree of
files that each include the next several times would otherwise grow exponentially:
five levels of 6 KB took 22 s, eight would take hours.""", 'include "a.cycle"   # a.cycle includes b.cycle five times, ...')
_add("E0114", "not a valid test-stand report", """
`cyclec draw --annotate FILE` reads a report written by `cyclec fire --json`. The file is
checked against the report's schema (the message names the first fields that do not
fit), and every reading it colours the diagram with must be a finite number: a NaN or
an Infinity (an engine that flamed out on the stand) cannot set an edge's width.""", "cyclec draw spec.cycle --annotate fire.json")
_add("E0115", "no run of this engine in the report", "The test-stand report given to `--annotate` holds runs of other engines only; fire this spec and annotate with that report.", "cyclec fire a.cycle --json fire.json && cyclec draw b.cycle --annotate fire.json")
_add("E0116", "--data cannot feed this engine", "`cyclec fire --data FILE` feeds the file's bytes as tokens: the engine's vocab must hold 256 tokens, and the file must hold at least one window of --seq + 1 bytes.", "cyclec fire tiny_vocab.cycle --data corpus.txt")
_add("E0117", "stand setting out of range", "A `cyclec fire` setting does not fit the engine: --seq longer than the context, a --batch or --train below its minimum.", "cyclec fire gpt2.cycle --seq 4096   # context 1024")
_add("E0223", "diagram too large to lay out", """
`cyclec draw` hands Graphviz at most 20,000 lines of DOT: 1,600 distinct stages make a
diagram that takes Graphviz minutes to lay out and that no page can show. Write the DOT
itself (`-o x.dot`), draw folded (without --expand), or gather stages into templates.""", "cyclec draw huge.cycle -o huge.svg")
_add("E0224", "Graphviz ran out of time", "Graphviz's `dot` is given 60 seconds to lay out a diagram; it did not finish. Write the DOT itself (`-o x.dot`) and lay it out separately.", "cyclec draw huge.cycle -o huge.svg")


# --- model families (issue 15, round two), appended -----------------------------------------------
_add("E0240", "rotary scaling option of another kind", """
Each rotary scaling reads its own options: `rotary_factor=` all four, `rotary_original=`
and `rotary_temperature=` dynamic, llama3 and yarn (linear stretches every frequency alike
and has no original context to count positions in), `rotary_low=` / `rotary_high=` llama3
only, `rotary_beta_fast=`, `rotary_beta_slow=` and `rotary_attention_factor=` yarn only. An
option of another kind would be silently ignored, so it is refused.""", "turbine attention heads=8 rotary rotary_scaling=linear rotary_factor=4 rotary_low=1")
_add("E0241", "rotary scaling without rotary", """
`rotary_scaling=` stretches the frequencies of rotary positions; an attention without
`rotary` has none to stretch.""", "turbine attention heads=8 rotary_scaling=yarn rotary_factor=4")
_add("E0242", "rotary scaling without a factor", """
Every rotary scaling needs `rotary_factor=`: how many times the pretraining context the
positions stretch over (transformers' rope_parameters `factor`). No default is safe: the
factor is the whole point of the scaling.""", "turbine attention heads=8 rotary rotary_scaling=llama3")
_add("E0243", "llama3 scaling band upside down", """
Llama 3's scaling keeps frequencies whose wavelength is under original/high, divides
those past original/low by the factor and blends in between; it needs `rotary_high=`
above `rotary_low=` (transformers' defaults are 4 and 1), or the band is empty and the
blend divides by zero or turns negative.""", "turbine attention heads=8 rotary rotary_scaling=llama3 rotary_factor=8 rotary_low=4 rotary_high=1")


def explanation(c: Code) -> str:
    """What `cyclec explain CODE` prints (the language server shows the same)."""
    out = f"{c.code}: {c.title}\n\n{c.explanation}\n"
    if c.example:
        out += "\nexample:\n" + "".join(f"    {line}\n" for line in c.example.splitlines())
    return out


def _order(c: Code) -> tuple:
    return ("EWN".index(c.code[0]), int(c.code[1:]))


def markdown() -> str:
    """docs/diagnostics.md: every code by severity and number (the reviewer's included: importing
    cyclelang registers them)."""
    lines = [
        "# Diagnostics",
        "",
        "Every message `cyclec` prints carries a stable code. `cyclec explain CODE` prints the",
        "same text as this page. Generated by `cyclec explain --markdown`; do not edit by hand.",
        "",
    ]
    for c in sorted(CODES.values(), key=_order):
        lines += [f"## {c.code}: {c.title}", "", c.explanation, ""]
        if c.example:
            lines += ["```", c.example, "```", ""]
    return "\n".join(lines).rstrip() + "\n"

