"""HF `model.generate()` on a translated model: the static KV cache as the translation's own state.

    gen = translator.translate_for_generation(model, max_cache_len=256)   # model: an HF causal LM
    out = gen.generate(ids, max_new_tokens=32, do_sample=False)

What a user expects from "translate my LLM" is `generate()` as before, on FlyDSL kernels. `translate(model, x)`
of an HF decoder serves one forward with `use_cache=False` (translator.adapters.hf): a `Cache` object
is no tensor, so it can be neither a graph input nor a graph output. The static cache can be state
instead: transformers' own export recipe (`TorchExportableModuleWithStaticCache`) registers each
layer's StaticCache tensors as buffers of a module whose forward is `(input_ids, cache_position) ->
logits`, and writes them with `index_copy_` in forward. That module is what we translate: its
buffers are the translated module's one cache (docs/state.md), written in place by the scatter
kernel (flydsl.cache_write), one graph for prefill and decode (the sequence dim stays dynamic).

`gen` is a shallow copy of the user's model (the same parameters, nothing of the user's modified)
whose `forward` calls that translation: `generate` runs its own loop (greedy, sampling, stopping
criteria) unchanged, and hands each step's `input_ids` and `cache_position` to the translation;
the cache object it makes is not read (the translation holds the cache). Every step's positions
are the cache slots written, as in HF's static cache, so a new `generate` call simply starts over
at position 0 (later slots are masked by the causal mask until they are written again).

The translation saves and loads as any other (`translator.save(gen.translated, path)`); after
`tm = translator.load(path)`, `translate_for_generation(model, max_cache_len=..., translated=tm)` makes
the generating model on it without translating again (the cache shape must match; the archive holds
the cache as it was at save time, and a generate call starts over at position 0).

Each layer's attention takes its causal mask as the step's positions (`q_pos`, read on the device): the
recipe builds HF's mask from the positions in the graph (attention_cache.py).

Left-padded prompts (a batch of different lengths, an attention_mask with 0s for the pads): the step takes
two more inputs, `key_start` [B], row b's first real token's cache slot (its pads are the slots before),
and `position_ids` [B, S], HF's positions of the rows (generate computes them from the mask: slot -
key_start, a pad's 0). It hands the model the padding mask that key_start implies, `arange(max_cache_len)
>= key_start[:, None]`, and those positions; in the translation the padding term of HF's mask becomes
the attention's `k_start`, read on the device, and each row's key loop starts at its first real key (no
mask tensor, no compare per score). An unpadded batch is key_start = 0 and the positions of the slots:
the same graph, the same launches as before (the positions an input, not a launch computing them). The
generating model reads the starts and the step's slots from the 2-D attention mask generate passes (its
width is the tokens so far), on the host, once per step.

Refused with an InputError, never run wrongly:
- a model that is not an HF causal LM or cannot take a static cache;
- sliding-window attention with max_cache_len beyond the window (the recipe replaces those layers
  by plain static ones: positions past the window would attend where the model would not);
- at run time: another batch size than the translation's, positions past max_cache_len, or an
  attention mask that is not left padding (a 0 after a kept token: right padding, or holes; a row of pads
  only) — a row's keys must be one run of slots from its first real token to the step's;
- a cache object passed to generate (`cache=` / `past_key_values=`, a DynamicCache or a StaticCache): the
  translation would neither fill it nor read what it holds (a cache filled before would make generate feed
  only the new tokens to a translation that never saw the prompt). Any `cache_implementation` is served by
  the translation's static cache: the same tokens (generate's own cache object is not read; `gen.generate`
  asks for a dynamic one, `_Generate`).
"""

from __future__ import annotations

import copy
import types

import torch

from ..errors import InputError


class StaticCacheStep(torch.nn.Module):
    """`(input_ids, cache_position) -> logits` of an HF causal LM, its StaticCache held as buffers.

    `one_counter=False` is transformers' recipe as it is: each layer keeps a 0-d int64 `cumulative_length`,
    reset to `cache_position[0]` at the step's start (one `copy_` per layer) and, in the layer's `update`,
    read for the write's positions (`arange(S) + cumulative_length`) and bumped (`add_(S)`): 3 one-element
    launches per layer per step, 96 per decode step of a 32-layer model.

    `one_counter=True` (translate_for_generation) keeps the same cache: the layers share one counter,
    reset once at the step's start; the step's positions `arange(S) + counter` are computed once, handed to
    the model as its `position_ids` (what it computes itself from the counter when given none) and every
    layer's `update` writes its K / V there (`index_copy_(2, positions, ..)`, as the recipe's layer does);
    the counter is bumped once at the step's end. Every layer's counter holds what the recipe's holds
    wherever the model reads it (`get_seq_length()` before the layers' updates, `cache_position[0]`) and
    after the step (`cache_position[0] + S`); the K / V land at the recipe's positions. A step costs 3
    one-element launches, not 3 per layer. With `key_start` ([B] int64) and `position_ids` ([B, S]; one_counter
    only: module notes) the model gets the padding mask and the positions of a left-padded batch."""

    def __init__(self, model, batch_size: int, max_cache_len: int, one_counter: bool = False):
        super().__init__()
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        gc = model.generation_config
        cfg = copy.deepcopy(gc)  # the recipe reads its checks from generation_config: ours, not the user's
        cfg.use_cache, cfg.cache_implementation = True, "static"
        model.generation_config = cfg
        try:
            self.step = TorchExportableModuleWithStaticCache(model, batch_size=batch_size, max_cache_len=max_cache_len)
        finally:
            model.generation_config = gc
        self.one_counter = one_counter
        if one_counter:
            counter = torch.zeros((), dtype=torch.long)  # held by the layers only (see forward)
            for i, layer in enumerate(self.step.static_cache.layers):
                self.step._buffers.pop(f"cumulative_length_{i}", None)
                layer.cumulative_length = counter
                layer.step_positions = None
                layer.update = types.MethodType(_write_at_step_positions, layer)

    def forward(self, input_ids, cache_position, key_start=None, position_ids=None):
        if not self.one_counter:
            return self.step(input_ids=input_ids, cache_position=cache_position)
        layers = self.step.static_cache.layers
        start = layers[0].cumulative_length  # read through a layer, as the model reads it (export lifted a
        # tensor reached by two paths, a buffer and a layer's attribute, as two tensors: the model read a stale one)
        start.copy_(cache_position[0])
        s = input_ids.shape[-1]
        positions = torch.arange(s, device=start.device) + start
        for layer in layers:
            layer.step_positions = positions
        mask = None
        if key_start is not None:  # a left-padded batch: row b's keys from slot key_start[b] on
            torch._check(key_start.shape[0] == input_ids.shape[0])  # one batch size for export (no node)
            slots = torch.arange(layers[0].keys.shape[-2], device=start.device)
            mask = slots[None, :] >= key_start[:, None]
        if position_ids is None:
            position_ids = positions[None]
        try:
            outs = self.step.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                   cache=self.step.static_cache, use_cache=True)
        finally:
            for layer in layers:
                layer.step_positions = None
        start.add_(s)
        return outs.logits if hasattr(outs, "logits") else outs.last_hidden_state


def _write_at_step_positions(layer, key_states, value_states, *args, **kwargs):
    """A StaticLayer's `update` under StaticCacheStep(one_counter=True): the recipe's write (`index_copy_`
    along the sequence dim) at the step's positions, with no per-layer counter bump."""
    pos = layer.step_positions
    if pos is None or key_states.shape[-2] != pos.shape[0]:  # a layer fed another length: its own positions
        pos = torch.arange(key_states.shape[-2], device=layer.keys.device) + layer.cumulative_length
    layer.keys.index_copy_(2, pos, key_states)
    layer.values.index_copy_(2, pos, value_states)
    return layer.keys, layer.values


def _check_model(model, max_cache_len: int) -> None:
    from ..adapters.hf import is_hf_model

    if not is_hf_model(model) or not hasattr(model, "generate"):
        raise InputError(f"translate_for_generation takes a transformers causal LM (a PreTrainedModel with "
                         f"generate()), got {type(model).__name__}; for a model of your own, translate() it and "
                         "call the translation from your own loop (README, section on generation)")
    cfg = model.config.get_text_config()
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    if window and max_cache_len > window and (not layer_types or any("sliding" in t for t in layer_types)):
        raise InputError(f"{type(model).__name__} attends over a sliding window of {window} tokens, and a static cache "
                         f"of max_cache_len={max_cache_len} would let positions past the window attend to tokens the "
                         f"model masks; use max_cache_len <= {window}")


def translate_for_generation(model, example_ids: torch.Tensor | None = None, *, max_cache_len: int,
                             batch_size: int = 1, translated=None, **translate_kwargs):
    """An HF causal LM whose `generate()` runs on the translated model with a static KV cache (see the
    module notes). `example_ids` [batch_size, S] (default: 4 zeros per row) is the capture's prompt;
    `translate_kwargs` go to translate() (backend, arch, precision, verify, ...). `translated`: a
    translation of this step made before (`translator.load` of a saved `gen.translated`), used as it is."""
    from ..api import translate

    _check_model(model, max_cache_len)
    if translated is not None:
        if example_ids is not None or translate_kwargs:
            raise InputError("translated= is a finished translation: pass no example_ids or translate() options "
                             f"with it (got {sorted(translate_kwargs) or 'example_ids'})")
        tm = translated
        _check_caches(tm, batch_size, max_cache_len)
    else:
        ids = example_ids if example_ids is not None else torch.zeros(batch_size, 4, dtype=torch.long)
        if ids.dim() != 2 or ids.shape[0] != batch_size:
            raise InputError(f"example_ids must be [batch_size={batch_size}, S] token ids, got {tuple(ids.shape)}")
        step = StaticCacheStep(model, batch_size, max_cache_len, one_counter=True)
        try:
            pos = torch.arange(ids.shape[1])
            tm = translate(step, (ids, pos, torch.zeros(batch_size, dtype=torch.long), pos.expand(batch_size, -1)),
                           **translate_kwargs)
        except InputError as e:
            _refuse_cache_shape(model, step, e)
            raise
    gen = copy.copy(model)  # shallow: the user's parameters and modules, the user's object untouched
    for d in ("_parameters", "_buffers", "_modules"):  # its own dicts: nothing set on gen reaches the user's model
        object.__setattr__(gen, d, dict(getattr(model, d)))
    object.__setattr__(gen, "forward", _Forward(tm, batch_size, max_cache_len))
    object.__setattr__(gen, "generate", _Generate(gen.generate))
    object.__setattr__(gen, "translated", tm)  # not a submodule: gen's state_dict stays the model's
    return gen


def _refuse_cache_shape(model, step, err: InputError) -> None:
    """The recipe sizes each layer's cache from the config (num_key_value_heads, else num_attention_heads;
    head_dim, else hidden_size / heads). A model whose attention writes K/V of another shape fails its first
    eager step inside `index_copy_`; say which config field to state (Falcon with multi_query=True writes one
    shared K/V head and keeps its count in `num_kv_heads`, which the recipe does not read)."""
    cause = err.__cause__
    if not (isinstance(cause, RuntimeError) and "index_copy_" in str(cause)):
        return
    layers = step.step.static_cache.layers
    shape = tuple(layers[0].keys.shape) if layers and getattr(layers[0], "keys", None) is not None else None
    raise InputError(f"{type(model).__name__}: transformers' static-cache recipe (TorchExportableModuleWithStaticCache) "
                     f"made each layer's KV cache {shape} ([batch, kv_heads, max_cache_len, head_dim]) from the config's "
                     f"num_key_value_heads (else num_attention_heads) and head_dim, but the model writes K/V of another "
                     f"shape ({cause}); set model.config.num_key_value_heads (and head_dim) to what the attention writes "
                     "(Falcon with multi_query=True: 1), or use model.forward = torch.compile(model.forward, "
                     "backend='flydsl') with generate(cache_implementation='static'), whose cache takes the model's own "
                     "K/V shapes") from cause


def cache_tensors(tm) -> list[torch.Tensor]:
    """The KV cache tensors of a generation step's translation, in the capture's order (layer 0's keys,
    its values, layer 1's ...): the [B, Hkv, max_cache_len, D] tensors its cache writes store into.

    The order is that of their get_attr nodes (export lifts the cache tensors in the order the model
    first touches them: keys, then values, layer by layer), not that of the writes: where RoPE fuses
    the V write and K's write stays separate (Phi3's partial-rotary `cat`), V is written first."""
    from functools import reduce

    out = []
    order = {n: i for i, n in enumerate(tm.gm.graph.nodes)}
    for n in tm.gm.graph.nodes:
        if n.op != "call_function":
            continue
        if "cache_write" in str(n.target):
            dests = [n.args[0]]
        elif str(n.target).startswith("flydsl.rope"):  # the fused RoPE + K/V cache write: kc (4), vc (7)
            dests = [n.args[4] if len(n.args) > 4 else n.kwargs.get("kc"),
                     n.args[7] if len(n.args) > 7 else n.kwargs.get("vc")]
        else:
            continue
        for d in dests:
            if isinstance(d, torch.fx.Node) and d.op == "get_attr":
                t = reduce(getattr, d.target.split("."), tm.gm)
                if t.dim() == 4 and not any(t is o for _, o in out):
                    out.append((order[d], t))
    return [t for _, t in sorted(out, key=lambda p: p[0])]


def _check_caches(tm, batch: int, max_len: int) -> None:
    caches = cache_tensors(tm) if hasattr(tm, "gm") else []
    if not caches:
        raise InputError(f"translated= takes the translation of a generation step (translator.load of a saved "
                         f"translate_for_generation(...).translated); {type(tm).__name__} writes no KV cache")
    shape = tuple(caches[0].shape)
    if shape[0] != batch or shape[2] != max_len:
        raise InputError(f"the translation's cache is [batch={shape[0]}, heads, max_cache_len={shape[2]}, head_dim]; "
                         f"call translate_for_generation(..., batch_size={shape[0]}, max_cache_len={shape[2]}, "
                         "translated=...)")


class _Generate:
    """The generating model's generate: refuses a cache object of the caller's (module notes), and asks generate
    for a dynamic cache object whatever cache_implementation says: the object is not read either way, a static
    one would be allocated for nothing, and for a static one generate builds the 4-D mask from that object's
    offset, which never advances (right at the prefill only); with a dynamic one forward gets the 2-D mask."""

    def __init__(self, generate):
        self.generate = generate

    def __call__(self, *args, **kwargs):
        for key in ("cache", "past_key_values"):
            if kwargs.get(key) is not None:
                raise InputError(f"generate({key}={type(kwargs[key]).__name__}(...)): the translated model holds its own "
                                 "static KV cache (translate_for_generation's max_cache_len) and would neither fill nor "
                                 f"read yours; call generate without {key}=, or, to generate on a cache object of your "
                                 "own (StaticCache or DynamicCache), run model.forward = torch.compile(model.forward, "
                                 "backend='flydsl') instead")
        return self.generate(*args, **{**kwargs, "cache_implementation": "dynamic"})


class _Forward:
    """The generating model's forward: the translation's logits, with the checks of the module notes."""

    def __init__(self, tm, batch: int, max_len: int):
        self.tm, self.batch, self.max_len = tm, batch, max_len
        # a translation made before key starts (a loaded archive of 2 inputs) serves unpadded batches only
        self.takes_starts = len(getattr(tm, "_input_spec", ())) == 4
        self.none = torch.zeros(batch, dtype=torch.long)
        self.starts = {}  # device -> (the last starts on the host, their copy there): one copy while they hold

    def __call__(self, input_ids=None, attention_mask=None, position_ids=None, cache_position=None, **kwargs):
        """generate() passes the step's positions as `position_ids` (transformers 5: the signature names it, so
        generate computes and advances them) or `cache_position` (transformers 4). With padding, the slots
        come from the mask (its last kept key is the step's last slot), not from a row's positions."""
        from transformers.modeling_outputs import CausalLMOutputWithPast

        if input_ids is None or (cache_position is None and position_ids is None):
            raise InputError("the translated generation step needs input_ids and the step's positions (position_ids "
                             "or cache_position, as generate() passes them); inputs_embeds are not supported")
        if input_ids.shape[0] != self.batch:
            raise InputError(f"batch of {input_ids.shape[0]} prompts, but the static cache was translated for "
                             f"batch_size={self.batch}; call translate_for_generation with batch_size="
                             f"{input_ids.shape[0]}")
        starts, last = key_starts(attention_mask, position_ids)
        if cache_position is None:
            s = input_ids.shape[-1]
            cache_position = position_ids[0] if last is None else \
                torch.arange(last - s + 1, last + 1, device=input_ids.device)
        end = int(cache_position[-1])
        if end >= self.max_len:
            raise InputError(f"generation reached position {end}, past the static cache's max_cache_len="
                             f"{self.max_len}; translate with a larger max_cache_len")
        if starts is None:
            return CausalLMOutputWithPast(logits=self._run(input_ids, cache_position, self.none, position_ids))
        if not self.takes_starts:
            raise InputError("the attention mask pads some prompt, and this translation (made by an older version, "
                             "with no key_start input) runs without one; translate the model again with "
                             "translate_for_generation, or generate unpadded prompts (one per call, or equal lengths)")
        return CausalLMOutputWithPast(logits=self._run(input_ids, cache_position, starts, position_ids))

    def _run(self, input_ids, cache_position, starts, position_ids):
        if not self.takes_starts:
            return self.tm(input_ids, cache_position)
        b, s = input_ids.shape
        host, there = self.starts.get(input_ids.device, (None, None))
        if host is None or not torch.equal(host, starts):
            host, there = starts, starts.to(input_ids.device)
            self.starts[input_ids.device] = host, there
        if position_ids is None or position_ids.shape[-1] != s:  # HF's: the slot less the row's start, a pad's 0
            position_ids = (cache_position[None, :] - there[:, None]).clamp(min=0)
        return self.tm(input_ids, cache_position, there, position_ids.expand(b, s))


def key_starts(mask, position_ids=None):
    """(key starts [B] int64, the step's last slot) of a left-padded batch's attention mask: 2-D [B, T] (the
    tokens so far, as generate passes it: the last slot is T - 1) or 4-D [B, 1, Sq, L] (bool keep, or additive
    0 / finfo.min: its last query row keeps the slots from the row's first real token to the step's; it must
    agree with position_ids, HF's positions of the left-padded rows). (None, last) where it pads nothing,
    (None, None) without a mask. Read on the host. Anything but left padding is refused (module notes)."""
    if mask is None:
        return None, None
    keep = mask.bool() if mask.dim() == 2 else mask[:, 0, -1] if mask.dtype == torch.bool else mask[:, 0, -1] == 0
    keep = keep.cpu()
    slots = torch.arange(keep.shape[-1])
    first = torch.where(keep, slots, keep.shape[-1]).min(-1).values
    last = torch.where(keep, slots, -1).max(-1).values
    ok = bool((last >= 0).all()) and bool((last == last[0]).all()) and \
        torch.equal(keep, (slots >= first[:, None]) & (slots <= last[:, None]))
    if ok and mask.dim() == 4 and position_ids is not None:
        if not torch.equal(position_ids[:, -1].cpu() + first, last):
            raise InputError("the 4-D attention mask does not describe this step (its last query row's keys disagree "
                             "with position_ids); pass the 2-D attention_mask ([batch, tokens so far], 0 for the pads)")
    if not ok:
        rows = [b for b in range(keep.shape[0]) if not torch.equal(keep[b], (slots >= first[b]) & (slots <= last[b]))]
        raise InputError(f"the attention mask is not a left-padded batch (row {rows[0] if rows else 0} keeps "
                         f"{keep[rows[0] if rows else 0].int().tolist()[:64]}): the static-cache step takes each row's "
                         "keys as one run of slots from its first real token to the step's (left padding); pad "
                         "prompts on the left (tokenizer.padding_side = 'left', what HF recommends for generation), "
                         "and give every row at least one real token")
    return (first if bool(first.any()) else None), int(last[0])
