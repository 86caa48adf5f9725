"""Model types the interop does not claim: for each, the claimed family nearest to it and what the
language lacks to write it.

Read from transformers 5.24's modeling files (and the `modular_*.py` beside them, which show how a
family differs from the one it derives from), for every decoder-only text model in
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` that `families` does not read. Encoder-decoder and encoder-only
models and speech or vision-only generative ones are left out. A multimodal wrapper is listed with what
the language lacks for it (its encoders) and the text config to import alone; where that text decoder
has a model type of its own, it has its own entry.

The second member names what the language lacks, in ML words. None: every part of the forward, as
transformers builds it from the family's default config, is already in the language (its weights may
still need regrouping or reordering, as phi3's fused ones do), and only an importer is missing. A
switch the default config leaves off (a clip_qkv, a qk-norm flag, another rotary kind) is not named
unless the family's released checkpoints set it (DBRX's clip_qkv): an importer refuses such a field
by name (E0401), as the claimed families' readers do.

E0402 uses the table (`families.refusal`): a model_type found here is refused with what the language
lacks and its nearest claimed family, or with the note that the language says the whole model and
only an importer is missing; a model_type in neither `families.READERS` nor here is refused as
unknown.
"""

# model_type -> (the nearest claimed family, what the language lacks for it; None: the language says the whole model, only an importer is missing)
UNCLAIMED: dict[str, tuple[str, str | None]] = {
    "apertus": ("llama", "an xIELU MLP (ungated, an activation with learned parameters)"),
    "apertus1p5_text": ("llama", "Apertus's xIELU MLP (ungated, learned activation parameters); an output head narrower than the input vocabulary (output_vocab_size)"),
    "axk2": ("deepseek_v2", "DeepSeek-V3.2 sparse attention (a lightning indexer keeps the top-k keys); a sigmoid output gate projected with the queries from the normed and raw query latent; low-rank sigmoid-gated RMSNorms"),
    "bailing_hybrid": ("deepseek_v2", "a Kimi-style gated delta-rule mixer (per-channel decay, short convolutions, a gated output norm: the language's gated DeltaNet decays per head); a sigmoid per-head gate on latent attention's output"),
    "beam": ("deepseek_v2", "depth-scaled residual adds (stream × √((k−1)/k), branch × 1/√k at the k-th add); a sigmoid output gate with a per-head bias (the language's gate is biased per channel, as q, k, v are); a log-position query scale on its NoPE global layers"),
    "bitnet": ("llama", "RMSNorms inside the branches (on the attention output before o_proj, on the MLP's hidden before down_proj); a squared-ReLU gated MLP"),
    "blt": ("llama", "byte-level modelling: a local byte encoder and decoder around a latent transformer over dynamic patches (hashed n-gram embeddings, byte-patch cross-attention)"),
    "cpmant": ("llama", "T5-style bucketed relative-position biases (per segment pair); segment and prompt embeddings"),
    "dbrx": ("mixtral", "clamped q, k, v (clip_qkv, which DBRX's released checkpoints set)"),
    "deepseek_v32": ("deepseek_v2", "DeepSeek-V3.2 sparse attention (a lightning indexer keeps the top-k keys)"),
    "deepseek_v4": ("deepseek_v2", "compressed sparse attention (pooled KV blocks chosen by an indexer) beside a sliding window, with one shared KV head, attention sinks and a grouped low-rank output (the language has sinks on full attention only); hash routing by token id; a clamped SwiGLU that is not gpt-oss's (silu(min(gate, L)) · clamp(up, ±L), where `act=swiglu_clamp` is gate · σ(1.702 · gate) · (up + 1)); the learned head that collapses the hyper-connection streams before the final norm (its mHC junctions are `chamber streams=N connections=manifold`, which sums the streams there)"),
    "diffllama": ("llama", "differential attention: two softmax maps subtracted with a learned λ, then a weightless RMSNorm per head"),
    "doge": ("llama", "dynamic-mask attention (a learned, value-dependent bias keeps the top-k keys); learned per-channel scales on the residual stream; a product-key mixture of tiny experts (CDMoE)"),
    "dory": ("gemma2", "a looped middle block (weight-shared layers run several times, the input re-injected); nGPT-style updates h + |α|·(f(h) − h) with weightless L2 norms; learned per-channel query and MLP scales; a sigmoid output gate whose logits are scaled by a learned per-channel square (σ(W x · s²): the language's is σ(W x)); a learned per-token logit scale"),
    "dots3_note": ("deepseek_v2", "vision and audio encoders (this is a multimodal model: import its text config (dots3_note_text) alone)"),
    "dots3_note_text": ("deepseek_v2", "DeepSeek-V3.2 sparse attention on latent attention (an indexer keeps the top-k keys); sliding-window latent layers; an RMSNorm on the rotary key; a sigmoid per-head output gate on latent attention (the language's output gate is on attention only)"),
    "emu3": ("llama", "a VQ image tokenizer whose image tokens share the text vocabulary (this is a multimodal model: import its text config (emu3_text_model, what AutoModelForCausalLM builds from it and saves) alone)"),
    "fuyu": ("gpt_neox", "image inputs (this is a vision-language model that projects image patches straight into its decoder: import its text config (persimmon) alone)"),
    "gemma3": ("gemma2", "a vision encoder (this is a vision-language model: import its text config (gemma3_text) alone)"),
    "gemma3n": ("gemma2", "vision and audio encoders (this is a multimodal model: import its text config (gemma3n_text) alone)"),
    "gemma3n_text": ("gemma2", "AltUp (several predicted residual streams, corrected after each layer), into whose first stream the per-layer inputs are gated (the per-layer embeddings are Gemma 4's but for token ids past vocab_size_per_layer_input, which read row 0 here; KV sharing across the last layers and the weightless value norm are Gemma 4's, in the language); a LAuReL low-rank residual branch; Gaussian top-k activation sparsity in the first MLPs"),
    "gemma4": ("gemma2", "vision and audio encoders (this is a multimodal model: import its text config (gemma4_text) alone)"),
    "gemma4_assistant": ("gemma2", "reading another model's hidden states and KV cache (this is a speculative-decoding drafter for Gemma 4, not a standalone model, with a centroid-masked output head)"),
    "gemma4_unified": ("gemma2", "vision and audio encoders (this is a multimodal model: import its text config (gemma4_unified_text) alone)"),
    "gemma4_unified_assistant": ("gemma2", "reading another model's hidden states and KV cache (this is a speculative-decoding drafter for Gemma 4 unified, not a standalone model, with a centroid-masked output head)"),
    "glm_moe_dsa": ("deepseek_v2", "DeepSeek-V3.2 sparse attention (an indexer keeps the top-k keys, its choice reused by the layers after it)"),
    "got_ocr2": ("qwen2", "a vision encoder (this is an OCR vision-language model: import its text config (qwen2) alone)"),
    "hrm_text": ("llama", "hierarchical recurrence: two weight-shared stacks looped in nested cycles over two states (its output gate is the language's gate=channel)"),
    "hy_v4": ("deepseek_v2", "DeepSeek-V3.2 sparse attention on latent attention, with attention sinks and a sigmoid output gate on it (the language has both on attention, not on latent attention); its hyper-connections' own form (no stream mixing: each junction keeps the streams and adds post times the output; pre and post from a projection multiplied by the RMS-normalised streams; post's magnitude a setting) and the learned head that collapses the streams"),
    "inkling2_loop_text": ("deepseek_v2", "attention residuals (each sublayer reads an attention over earlier blocks' outputs); learned relative-position biases; residual short convolutions on keys, values and sublayer outputs (not the language's short_conv mixer, LFM2's gated one); a soft-capped SwiGLU; a looped (weight-shared) middle span with gated messages between passes"),
    "inkling2_text": ("deepseek_v2", "attention residuals (each sublayer reads an attention over earlier blocks' outputs); learned relative-position biases; residual short convolutions on keys, values and sublayer outputs (not the language's short_conv mixer, LFM2's gated one); a soft-capped SwiGLU"),
    "inkling_text": ("deepseek_v2", "learned relative-position biases; residual short convolutions on keys, values and sublayer outputs (not the language's short_conv mixer, LFM2's gated one); router-weighted shared experts"),
    "jetmoe": ("mixtral", "mixture of attention heads (routed query and output projections, shared keys and values); a bias on the MoE's output"),
    "kimi_linear": ("deepseek_v2", "Kimi Delta Attention (a gated delta rule with a per-channel decay, short convolutions, a gated output norm: the language's gated DeltaNet decays per head); latent attention without rotary"),
    "kolibri1": ("deepseek_v2", "its correction bias is added to the router's raw logits for the choice (top-k of logits + b), the weights then sigmoid(logits): the language's correction= adds to the sigmoid scores, another choice"),
    "llama4": ("llama", "a vision encoder (this is a vision-language model: import its text config (llama4_text) alone)"),
    "llama4_text": ("llama", "chunked attention (fixed blocks, not a sliding window); a log-position query temperature on NoPE layers; sigmoid router scores that scale the expert's input"),
    "longcat_flash": ("deepseek_v2", "a shortcut MoE (read mid-block, added at the block's end) beside two attention+MLP sublayers; zero-computation (identity) experts"),
    "mimo_v2_flash": ("deepseek_v2", "a value head width other than the query/key's (its sinks, sliding windows and router are in the language)"),
    "minimax": ("mixtral", "lightning attention (linear attention with a fixed per-head, per-layer decay, an output RMSNorm and a sigmoid output gate); residuals that carry the normed input, scaled by α and β"),
    "minimax_m3_vl_text": ("mixtral", "block-sparse attention (an indexer keeps the top-k key blocks); its clamped SwiGLU is gpt-oss's, in the language (act=swiglu_clamp)"),
    "mllama": ("llama", "a vision encoder and cross-attention to it (this is a vision-language model whose gated cross-attention layers are skipped for text alone: import its text config (mllama_text_model) alone)"),
    "modernbert-decoder": ("gemma2", "a head transform (dense, GELU, LayerNorm) before the tied output projection"),
    "phi4_multimodal": ("phi3", "image and audio encoders (this is a multimodal model around a Phi-3 decoder: import its decoder's fields alone, as a phi3 config)"),
    "phimoe": ("mixtral", "SparseMixer routing (each of the top-2 weights a softmax over the logits within a threshold of its expert's)"),
    "qwen3_5": ("qwen3", "a vision encoder (this is a vision-language model: import its text config (qwen3_5_text) alone)"),
    "qwen3_5_moe": ("qwen2_moe", "a vision encoder (this is a vision-language model: import its text config (qwen3_5_moe_text) alone)"),
    "qwen4_exp": ("qwen2_moe", "a vision encoder (this is a vision-language model: import its text config (qwen4_exp_text) alone)"),
    "qwen4_exp_text": ("qwen2_moe", "its hyper-connections' own form (several residual streams read through low-rank per-channel silu mix weights, written back by 2 sigmoid injection weights, no stream mixing; not Zhu et al.'s or mHC's); block-sparse attention chosen by a query-aware indexer; hashed n-gram per-layer embeddings (its gated DeltaNet and Qwen3-Next's attention output gate are in the language; its gated norm's activation, output_gate_type, other than silu is not)"),
    "recurrent_gemma": ("gemma", "Griffin's recurrent block (an RG-LRU gated linear recurrence after a short convolution, in a GeLU-gated branch)"),
    "reformer": ("gpt2", "LSH and chunked local attention; reversible residual layers; axial position embeddings"),
    "rwkv": ("mamba", "RWKV's time mixing (the WKV recurrence with token shift) and channel mixing (squared ReLU behind a receptance gate)"),
    "xglm": ("gpt2", "fairseq sinusoidal positions (sin and cos halves, frequencies over d/2 − 1, offset by the padding index)"),
    "xlstm": ("mamba", "xLSTM's mLSTM blocks (a matrix memory with exponential input and forget gates)"),
    "zamba": ("jamba", "a weight-shared attention block reused every few layers, reading the stream concatenated with the input embeddings; a multi-head Mamba-1 mixer (per-head x and dt projections)"),
    "zamba2": ("mamba2", "weight-shared transformer blocks reused at several depths, reading the stream concatenated with the input embeddings, with per-use LoRA adapters"),
    "zaya": ("qwen2_moe", "convolutional compressed attention (q, k, v from a down-projection through short convolutions); learned per-channel scales and biases on both stream and branch at each residual add; an MLP router that carries state across layers, with a skip expert"),
}

# The other model types of transformers 5.24's causal-LM mapping: not decoder-only text models (encoder-only models
# and encoder-decoders used as a decoder, speech and music generators, an OCR decoder over an image encoder, XLNet's
# permutation LM). E0402 refuses them as unknown; tests/test_closed_world.py checks that the three tables
# (`families.READERS`, UNCLAIMED, LEFT_OUT) cover the mapping, so a release's new family shows up there by name.
LEFT_OUT: frozenset[str] = frozenset({
    # encoder-only models with a causal-LM head for use as a decoder
    "bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert", "rembert", "roberta",
    "roberta-prelayernorm", "roc_bert", "roformer", "xlm", "xlm-roberta", "xlm-roberta-xl", "xmod",
    # encoder-decoders whose decoder the mapping lists
    "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart", "prophetnet",
    # speech, music and image-to-text generators
    "moshi", "moss_transcribe_diarize", "musicgen", "musicgen_melody", "trocr", "whisper", "git",
    # permutation language modelling
    "xlnet",
})
