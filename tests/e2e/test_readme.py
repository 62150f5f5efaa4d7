"""The README's supported-op table is generated from the registry, and its commands exist."""

from pathlib import Path

from translator.report.ops_table import readme_with_table

ROOT = Path(__file__).resolve().parents[2]


def test_ops_table_is_current():
    text = (ROOT / "README.md").read_text()
    assert readme_with_table(text) == text, "run: .venv/bin/python -m translator.report.ops_table --update-readme"


def test_ci_calls_the_readme_test_command():
    assert "./run test" in (ROOT / "README.md").read_text()
    assert "./run test" in (ROOT / ".ci" / "run").read_text()


def _section_code(title: str) -> str:
    """The python code blocks of README's section `title`, joined."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(block.split("\n```", 1)[0] for block in section.split("```python\n")[1:])


def test_torch_compile_section_runs(tmp_path, monkeypatch, fresh_dynamo):
    """Every line of README's torch.compile section, as written, on the names it assumes (a small
    model and its input, a translation of it, an .onnx file, a tiny HF Llama and its prompt); the HF
    generation recipe gives eager's tokens with every call translated."""
    import torch
    import torch.nn.modules.module as M

    import translator
    from translator import weights

    transformers = __import__("pytest").importorskip("transformers")
    for table in (M._global_parameter_registration_hooks, M._global_buffer_registration_hooks,
                  M._global_module_registration_hooks):  # see test_generation_hf._no_registration_hooks
        for key in [k for k, v in table.items() if v is getattr(weights, "changed", None)]:
            monkeypatch.delitem(table, key)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()
    x = torch.randn(4, 16)
    torch.onnx.export(model, (x,), "model.onnx", dynamo=False)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    hf_model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    input_ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model.generate(input_ids, max_new_tokens=8, do_sample=False, cache_implementation="static")
    ns = {"torch": torch, "model": model, "x": x, "hf_model": hf_model, "input_ids": input_ids,
          "tm": translator.translate(model, (x,), backend="reference")}
    code = _section_code("torch.compile, save / load, ONNX, HuggingFace")
    assert "cache_implementation=\"static\"" in code and "translator.compile_reports()" in code
    with torch.no_grad():
        exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 — our own README
    assert torch.equal(ns["out"], want)
    recs = translator.compile_reports()
    assert not any(r.calls_pytorch or r.dynamo_fallback for r in recs), [r.line() for r in recs]
    assert sum(r.calls_translated for r in recs) == 1 + 8  # the compiled model's call, then 8 generation steps
