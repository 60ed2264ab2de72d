"""The gguf-lens command. Bad input exits 2 with one line on stderr, never a traceback."""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from typing import Any, NoReturn, Sequence

import numpy as np

from engine.cli.options import add_interventions, add_numerics, read_text_file
from engine.errors import LensError, SettingError

log = logging.getLogger("gguf_lens")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _read_text(args: argparse.Namespace) -> str:
    """--text as given, or --text-file's bytes as UTF-8 with its line endings kept."""
    if getattr(args, "text", None) is not None:
        return args.text
    return read_text_file(args.text_file)


def _load(args: argparse.Namespace, warm: bool = True):
    from engine.model import load_model  # noqa: PLC0415

    progress = None
    if sys.stderr.isatty():
        def progress(what: str, frac: float) -> None:
            sys.stderr.write(f"\r{what} {frac * 100:5.1f}%\033[K")
            if frac >= 1.0:
                sys.stderr.write("\r\033[K")
    model = load_model(args.model, backend=getattr(args, "backend", "numpy"), progress=progress, warm=warm,
                       numerics=getattr(args, "numerics", "ggml"), flash_attn=getattr(args, "flash_attn", "off"),
                       cache_type=getattr(args, "cache_type", None))
    if late_note() is not None:
        print(f"note: {late_note()}", file=sys.stderr)
    try:
        _intervene(args, model)
    except LensError:
        model.close()
        raise
    return model


def late_note() -> str | None:
    """What a first start still compiles in the background, if it does (engine.kernels.precompile), else None."""
    from engine.kernels import precompile  # noqa: PLC0415

    running = precompile.late_status()
    if running is None:
        return None
    return (f"first start: faster kernels (decode step, prompt attention, VNNI batches) are compiling in the "
            f"background ({running:.0f} s so far) and are cached for the next start; until they are ready tokens "
            f"take a slower path with the same numbers")


def _intervene(args: argparse.Namespace, model) -> None:  # noqa: ANN001
    """--ablate-head, --control-vector and --lora, each named on stderr once applied."""
    from engine.intervene import ablation as ab  # noqa: PLC0415

    what = ab.parse(model, getattr(args, "ablate_head", ()), getattr(args, "ablate_attn", ()),
                    getattr(args, "ablate_ffn", ()), getattr(args, "ablate_expert", ()))
    if getattr(args, "ablate_mean", False) and not what.heads:
        raise SettingError("--ablate-mean: no --ablate-head to mean-ablate")
    if not what.empty:
        ab.ablate(model, what)  # heads zeroed; --ablate-mean replaces them once the input is known (_mean_ablate)
        if not getattr(args, "ablate_mean", False):
            print(f"note: {what.describe()}", file=sys.stderr)
    if getattr(args, "control_vector", None):
        from engine.intervene import control_vector as cv  # noqa: PLC0415

        vec = cv.load([cv.parse_spec(t) for t in args.control_vector], model.args.dim, model.args.n_layers, model.arch)
        cv.apply(model, vec)
        print(f"note: {vec.describe()}", file=sys.stderr)
    if getattr(args, "lora", None):
        from engine.intervene import lora  # noqa: PLC0415

        adapters = [lora.load(model, *lora.parse_spec(t)) for t in args.lora]
        lora.apply(model, adapters)
        print(f"note: {lora.describe(adapters)}", file=sys.stderr)


def _interventions(model) -> list[str]:  # noqa: ANN001
    """What --ablate-*, --control-vector and --lora set on the model, each as it names itself (for --json)."""
    from engine.intervene import ablation, lora  # noqa: PLC0415
    from engine.intervene import control_vector as cv  # noqa: PLC0415

    vec = cv.current(model)
    said = (ablation.current(model).describe(), vec.describe() if vec else "", lora.describe(lora.current(model)))
    return [text for text in said if text]


def _mean_ablate(args: argparse.Namespace, model, ids: list[int]) -> None:  # noqa: ANN001
    """--ablate-mean: the ablated heads output their mean over the input's tokens `ids`."""
    if getattr(args, "ablate_mean", False):
        from engine.intervene import ablation as ab  # noqa: PLC0415

        what = ab.head_means(model, ids, ab.current(model))
        ab.ablate(model, what)
        print(f"note: {what.describe()}", file=sys.stderr)


def _tokenizer_only(model: str):
    from engine.catalog import resolve_model  # noqa: PLC0415
    from engine.gguf import open_gguf  # noqa: PLC0415
    from engine.tokenizer.vocab import Tokenizer  # noqa: PLC0415

    with open_gguf(resolve_model(model)) as g:
        return Tokenizer.from_metadata(g.metadata)


def cmd_fetch(args: argparse.Namespace) -> int:
    from engine.catalog import CATALOG, fetch  # noqa: PLC0415

    names = list(CATALOG) if args.name == "all" else [args.name]
    for name in names:
        def progress(what: str, frac: float, name: str = name) -> None:
            sys.stderr.write(f"\r{name}: {what} {frac * 100:5.1f}%\033[K" if sys.stderr.isatty() else "")
        path = fetch(name, progress=progress)
        if sys.stderr.isatty():
            sys.stderr.write("\r\033[K")
        print(path)
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    """Ids as llama_tokenize(add_special=True) gives them: BOS/EOS as the metadata says, unless --bos/--no-bos."""
    tok = _tokenizer_only(args.model)
    ids = tok.encode(_read_text(args), add_special=False, parse_special=not args.no_special)
    add_bos = tok.add_bos if args.bos is None else args.bos
    if add_bos:
        if tok.bos_id is None:
            raise SettingError("--bos: this model has no BOS token")
        ids = [tok.bos_id] + ids
    if tok.add_eos:
        ids.append(tok.eos_id)
    print(json.dumps(ids))
    return 0


def _prompt_ids(model, text: str) -> list[int]:
    """The text as the model's own tokenizer makes it for a whole document (BOS when the metadata adds one)."""
    return model.tokenizer.encode(text, add_special=True, parse_special=False)


def cmd_logits(args: argparse.Namespace) -> int:
    from engine.generate import prefill  # noqa: PLC0415

    model = _load(args)
    from engine.cli import encdec  # noqa: PLC0415 - T5: the decoder's logits given --encoder-tokens-file

    if encdec.wants(args, model):
        return encdec.cmd_logits(args, model)
    if args.tokens_file:
        try:
            ids = json.loads(read_text_file(args.tokens_file, "--tokens-file"))
        except ValueError as exc:
            raise SettingError(f"--tokens-file {args.tokens_file}: not JSON ({exc})") from None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise SettingError(f"--tokens-file {args.tokens_file}: must be a JSON list of integers")
    else:
        ids = _prompt_ids(model, _read_text(args))
    if not ids:
        raise SettingError("no tokens to run")
    _mean_ablate(args, model, ids)
    logits = prefill(model, ids, model.new_cache(), all_logits=True, chunk_size=args.chunk)
    np.save(args.out, logits.astype(np.float32))
    print(f"wrote {args.out}: {logits.shape[0]} x {logits.shape[1]} float32", file=sys.stderr)
    return 0


def perplexity(model, ids: list[int], chunk: int = 256) -> dict[str, Any]:
    """exp(mean NLL) of tokens 2..n given their prefixes, the whole text in one context."""
    from engine.generate import log_softmax, prefill  # noqa: PLC0415

    if len(ids) < 2:
        raise SettingError("perplexity needs at least 2 tokens")
    logits = prefill(model, ids, model.new_cache(max(len(ids), 1)), all_logits=True, chunk_size=chunk)
    logp = log_softmax(logits[:-1])
    nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    return {"ppl": float(math.exp(float(np.mean(nll, dtype=np.float64)))), "tokens": len(ids)}


def cmd_perplexity(args: argparse.Namespace) -> int:
    model = _load(args)
    from engine.cli import encdec  # noqa: PLC0415 - T5: the text's perplexity given --encoder-text

    encoder_text = encdec.perplexity_encoder_text(args, model)
    if encoder_text is not None:
        return encdec.cmd_perplexity(args, model, encoder_text, _read_text(args))
    ids = _prompt_ids(model, _read_text(args))
    if len(ids) > model.args.n_ctx:
        raise SettingError(f"the text is {len(ids)} tokens, longer than the model's context {model.args.n_ctx}")
    t0 = time.perf_counter()
    out = perplexity(model, ids, args.chunk)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"perplexity {out['ppl']:.4f} over {out['tokens']} tokens ({time.perf_counter() - t0:.1f} s)")
    return 0


def _sampler(args: argparse.Namespace):
    from engine.sampler import SamplerSettings  # noqa: PLC0415

    return SamplerSettings(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, seed=args.seed,
    ).check()


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.generate import GenerationConfig, generate  # noqa: PLC0415

    cfg = GenerationConfig(max_tokens=args.n, sampler=_sampler(args)).check()
    model = _load(args)
    if args.chat:
        rendered = model.chat.render([{"role": "user", "content": args.prompt}])
        if rendered.warning:
            print(f"warning: {rendered.warning}", file=sys.stderr)
        ids = model.tokenizer.encode(rendered.text, add_special=True, parse_special=True)
    else:
        ids = model.tokenizer.encode(args.prompt, add_special=True, parse_special=False)
    _mean_ablate(args, model, ids)
    text, out_ids, last = [], [], None
    for step in generate(model, ids, cfg):
        text.append(step.text)
        if step.token_id >= 0 and step.finish_reason != "eos":
            out_ids.append(step.token_id)
        last = step
        if not args.json:
            sys.stdout.write(step.text)
            sys.stdout.flush()
    if args.json:
        print(json.dumps({"text": "".join(text), "tokens": len(out_ids), "token_ids": out_ids,
                          "prompt_tok_s": last.prompt_tok_s if last else 0.0,
                          "gen_tok_s": last.gen_tok_s if last else 0.0,
                          "finish_reason": last.finish_reason if last else None,
                          "interventions": _interventions(model)}, ensure_ascii=False))
    else:
        print()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from engine.generate import GenerationConfig, generate  # noqa: PLC0415

    cfg = GenerationConfig(max_tokens=args.n, sampler=_sampler(args)).check()
    if args.ablate_mean:
        raise SettingError("--ablate-mean takes its means over an input: use it with logits or generate")
    model = _load(args)
    cache = model.new_cache()
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print(f"{model.name} ({model.arch}, {model.path.name}). Empty line or Ctrl+D quits; Ctrl+C stops a reply.")
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        rendered = model.chat.render(messages)
        if rendered.warning:
            print(f"[{rendered.warning}]")
        ids = model.tokenizer.encode(rendered.text, add_special=True, parse_special=True)
        reply: list[str] = []
        last = None
        try:
            for step in generate(model, ids, cfg, cache=cache):
                reply.append(step.text)
                last = step
                sys.stdout.write(step.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            reply.append(" [stopped]")
        except LensError as exc:
            print(f"\n[error: {exc}]")
            messages.pop()
            continue
        stats = f"{last.index} tokens, {last.gen_tok_s:.1f} tok/s" if last else ""
        print(f"\n[{stats}]")
        messages.append({"role": "assistant", "content": "".join(reply)})




def cmd_gui(args: argparse.Namespace) -> int:
    # the engine never imports the app: the desktop front end registers itself as an entry point
    from importlib.metadata import entry_points  # noqa: PLC0415

    found = [ep for ep in entry_points(group="gguf_lens.frontends") if ep.name == "gui"]
    if not found:
        raise SettingError("the desktop app is not installed (run ./dev setup)")
    try:
        app_main = found[0].load()
    except ImportError as exc:
        raise SettingError(f"the desktop app cannot start: {exc}") from None
    return int(app_main([args.model] if args.model else []) or 0)


def _add_model(p: argparse.ArgumentParser, optional: bool = False) -> None:
    from engine.catalog import DEFAULT_MODEL  # noqa: PLC0415

    if optional:
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="a .gguf path or catalog name")
    else:
        p.add_argument("model", help="a .gguf path or catalog name (smollm2-135m-instruct, gemma3-270m)")


def _add_text(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--text-file", help="a UTF-8 text file, read byte for byte (a regular file, at most 256 MiB)")


def _add_sampling(p: argparse.ArgumentParser, temp: float) -> None:
    p.add_argument("-n", type=int, default=256, help="most tokens to generate")
    p.add_argument("--temp", type=float, default=temp)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="gguf-lens", description="Run GGUF models on NumPy and look inside them.")
    ap.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = ap.add_subparsers(dest="cmd", parser_class=_Parser)

    p = sub.add_parser("gui", help="open the desktop app")
    p.add_argument("model", nargs="?", default=None)
    p.set_defaults(func=cmd_gui)

    from engine.cli.inspect import cmd_inspect  # noqa: PLC0415

    p = sub.add_parser("fetch", help="download a catalog model into the cache; prints its path")
    p.add_argument("name", nargs="?", default="smollm2-135m-instruct", help="catalog name or 'all'")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("inspect", help="metadata and tensors of a GGUF file; warns when the model cannot run")
    _add_model(p)
    p.add_argument("--json", action="store_true", help="one JSON object, with a 'problems' list")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("tokenize", help="token ids of a text as a JSON list, as llama_tokenize(add_special=True)",
                       description="Token ids as llama.cpp's llama_tokenize with add_special: BOS and EOS are "
                                   "added as the model's tokenizer.ggml.add_bos_token / add_eos_token say "
                                   "(--bos / --no-bos force BOS on or off); special-token text is parsed "
                                   "unless --no-special. --text-file is read as UTF-8 bytes, line endings kept.")
    _add_model(p)
    _add_text(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--bos", dest="bos", action="store_const", const=True, default=None,
                   help="prepend the BOS token even where the metadata says not to")
    g.add_argument("--no-bos", dest="bos", action="store_const", const=False,
                   help="no BOS token even where the metadata adds one")
    p.add_argument("--no-special", action="store_true", help="treat special-token text as plain text")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("logits", help="float32 logits [n_tokens, n_vocab] for every position")
    _add_model(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens-file")
    g.add_argument("--text-file")
    p.add_argument("--out", required=True)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--encoder-tokens-file", help="T5: the encoder's token ids (JSON); --tokens-file is the decoder's")
    add_numerics(p)
    add_interventions(p)
    p.set_defaults(func=cmd_logits)

    p = sub.add_parser("generate", help="generate a continuation")
    _add_model(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--json", action="store_true")
    _add_sampling(p, temp=0.0)
    add_numerics(p)
    add_interventions(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="a terminal chat with streaming output")
    _add_model(p, optional=True)
    p.add_argument("--system", default=None, help="system prompt")
    _add_sampling(p, temp=0.7)
    add_numerics(p)
    add_interventions(p)
    p.set_defaults(func=cmd_chat)

    from engine.cli.bench import add_command as add_bench  # noqa: PLC0415

    add_bench(sub, _add_model)

    p = sub.add_parser("perplexity", help="perplexity of a text in one context (T5: given --encoder-text)")
    _add_model(p)
    _add_text(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--encoder-text", help="T5: the encoder's input; the perplexity is of --text given it")
    g.add_argument("--encoder-text-file", help="T5: the encoder's input as a UTF-8 file")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--json", action="store_true")
    add_numerics(p)
    p.set_defaults(func=cmd_perplexity)

    from engine.cli.routing import add_command as add_routing  # noqa: PLC0415

    add_routing(sub, _add_model, _load)
    from engine.cli.cvector import add_command as add_cvector  # noqa: PLC0415

    add_cvector(sub, _add_model, _load)
    from engine.cli.quant import add_commands  # noqa: PLC0415 - quantize and compare

    add_commands(sub)
    from engine.cli.imatrix import add_commands as add_imatrix  # noqa: PLC0415

    add_imatrix(sub)
    from engine.cli.serve import add_command as add_serve  # noqa: PLC0415

    add_serve(sub, _add_model)
    from engine.cli.attribute import add_command as add_attribute  # noqa: PLC0415

    add_attribute(sub, _add_model, _load)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gguf-lens` console script."""
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s: %(message)s")
    if args.cmd is None:
        args = ap.parse_args(["gui", *([] if argv is None else list(argv))])
    try:
        return int(args.func(args) or 0)
    except LensError as exc:
        sys.stderr.write(f"gguf-lens: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("gguf-lens: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: one line unless --debug
        if args.debug:
            raise
        sys.stderr.write(f"gguf-lens: internal error: {type(exc).__name__}: {exc} (run with --debug for details)\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
