"""LitServe's view of our translators (``TranslationAPI``): requests decoded, batched by
model, beam, attention and nbest, translated, answered."""

import logging
import signal
from collections.abc import Sequence
from typing import Any

import litserve
from fastapi.responses import JSONResponse, Response
from litserve.loops.simple_loops import SingleLoop

from nmt.alignment import aligned
from nmt.attention_stats import attention_matrix, check_attention_choice
from nmt.data.tokenizer import EOS_PIECE
from nmt.engines import load_translator
from nmt.errors import NMTError
from nmt.serve.models import attention_maps
from nmt.serve.processes import TimeoutAdvice, worker_loop
from nmt.serve.request import MAX_PIECES, Job, Rejected, RequestBody, parse_request, quoted
from nmt.translator import source_limit

BATCH_TIMEOUT = 0.02  # seconds the worker waits for more requests to batch with


def attention_view(translation, layer: int = -1, head: str = "mean") -> dict | None:
    """The best translation's cross-attention as JSON: source pieces across, target down; for a
    Transformer, ``layer``'s mean over heads or one head (``head``: "mean" or a head number)."""
    if translation.attention is None:
        return None
    one_head = None if head == "mean" else int(head)
    weights = attention_matrix(translation.attention, layer, one_head)  # (T, S)
    target = (translation.pieces + [EOS_PIECE])[: weights.size(0)]
    return {"source": translation.source, "target": target,
            "weights": [[round(w, 4) for w in row] for row in weights.tolist()]}


class TranslationAPI(litserve.LitAPI):
    """LitServe's view of our translators: decode_request -> predict (batched) -> response."""

    def __init__(self, runs: dict[str, str], engine: str, default_beam: int, max_batch: int,
                 weights: str | None = None, precision: str | None = None,
                 ensemble: Sequence[str] = ()):
        super().__init__(max_batch_size=max_batch, batch_timeout=BATCH_TIMEOUT,
                         api_path="/translate", loop=worker_loop(max_batch))
        self.runs, self.engine, self.default_beam = runs, engine, default_beam
        # as translate's --weights, --precision and --ensemble (the one run's members)
        self.weights, self.precision, self.ensemble = weights, precision, list(ensemble)
        # model name -> (layers, heads) of the cross-attention maps a request may pick from (an
        # ensemble answers none)
        self.layouts = {} if ensemble else {name: attention_maps(path, engine)
                                            for name, path in runs.items()}

    def setup(self, device: str) -> None:
        """Load every model and translate one sentence with each, so that one-time costs
        (kernel initialisation, first allocations: seconds on a CPU) are paid before /health
        says ready, not by the first requests. Runs in LitServe's worker process."""
        # Ctrl-C reaches the terminal's whole process group: this worker too, where Python's
        # KeyboardInterrupt printed a 25-line traceback over the server's quiet exit. It ends
        # quietly instead, as on SIGTERM (how the server's own shutdown stops it); not ignored,
        # as a worker left running would keep a server interrupted while starting from exiting.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        logging.getLogger(SingleLoop.__module__).addFilter(TimeoutAdvice())  # its loops' logger
        # auto's precision for a batch of requests at --beam (a request may name another)
        self.translators = {name: load_translator(path, self.engine, device, self.weights,
                                                  self.precision, self.max_batch_size,
                                                  self.default_beam, self.ensemble)
                            for name, path in self.runs.items()}
        for translator in self.translators.values():
            translator.translate(["warm-up"], self.default_beam)

    def decode_request(self, request: RequestBody) -> Job | Rejected:
        job = parse_request(request, list(self.runs), self.default_beam)
        if isinstance(job, Rejected):
            return job
        if job.alignment and self.ensemble:
            return Rejected("'alignment' reads one model's attention, and this server decodes an "
                            "ensemble: serve the run alone, without --ensemble")
        return self._check_attention_choice(job) or self._check_beam(job) or self._measure(job)

    def _check_beam(self, job: Job) -> Rejected | None:
        """A 400 where the job's beam is more than its model's vocabulary: translate refuses
        it (``check_beam``), which was a 500 "translation failed" from the worker."""
        vocab = len(self.translators[job.model].tokenizer)
        if job.beam <= vocab:
            return None
        return Rejected(f"'beam' must be at most the vocabulary's {vocab:,} pieces for model "
                        f"{quoted(job.model)}, got {job.beam}")

    def _check_attention_choice(self, job: Job) -> Rejected | None:
        """A 400 where the job's "attention_layer" or "attention_head" picks a map its model
        lacks (as translate's check of --attention-layer and --attention-head), or any map but
        the default from an ensemble, which answers none; None where the choice is fine. Checked
        whether or not the job asks for attention or alignments: a client's mistake is named."""
        fields = ("'attention_layer'", "'attention_head'")
        if self.ensemble:
            if (job.attention_layer, job.attention_head) == (-1, "mean"):
                return None
            return Rejected(f"an ensemble answers no attention map: no {fields[0]} or {fields[1]} "
                            "to pick")
        try:
            check_attention_choice(*self.layouts[job.model], job.attention_layer,
                                   job.attention_head, fields, self.engine)
        except NMTError as err:
            return Rejected(str(err))
        return None

    def _measure(self, job: Job) -> Job | Rejected:
        """The job with a warning for each text cut to the model's length; a 413 where its
        texts hold more than ``MAX_PIECES`` pieces even so (it would hold up every request
        batched with it: 64 texts of 511 pieces take minutes at beam 16 on a CPU)."""
        translator = self.translators[job.model]
        full = translator.tokenizer.encode(job.texts)
        limit = source_limit(translator.max_positions)  # as translate will cut them
        kept = [min(len(ids), limit) for ids in full]
        if sum(kept) > MAX_PIECES:
            return Rejected(f"the texts hold {sum(kept):,} pieces; at most {MAX_PIECES:,} per "
                            "request: send fewer or shorter texts", 413)
        job.warnings = [f"text {number} has {len(ids)} pieces; truncated to {length}"
                        for number, (ids, length) in enumerate(zip(full, kept), start=1)
                        if length < len(ids)]
        return job

    def predict(self, items: list[Job | Rejected] | Job | Rejected
                ) -> list[dict | Rejected] | dict | Rejected:
        """Group the jobs by (model, beam, whether they need the attention, nbest); one
        ``translate`` call per group.
        With max_batch_size 1, LitServe hands over each request alone, and takes its answer."""
        if not isinstance(items, list):
            return self.predict([items])[0]
        outputs: list[dict | Rejected] = list(items)
        groups: dict[tuple, list[int]] = {}
        for position, item in enumerate(items):
            if isinstance(item, Job):
                key = (item.model, item.beam, item.attention or item.alignment, item.nbest)
                groups.setdefault(key, []).append(position)
        for positions in groups.values():
            jobs = [items[p] for p in positions]
            for position, answer in zip(positions, self._translate_group(jobs)):
                outputs[position] = answer
        return outputs

    def _translate_group(self, jobs: list[Job]) -> list[dict | Rejected]:
        """One ``translate`` call for jobs sharing model, beam, the need for attention and nbest;
        its answers are split back in job order. A failure fails these jobs only, not the whole
        batch."""
        texts = [text for job in jobs for text in job.texts]
        first = jobs[0]
        # An ensemble's answers carry no attention: it would be its first run's alone.
        need_attn = (first.attention or first.alignment) and not self.ensemble
        try:
            results = self.translators[first.model].translate(  # warnings: in each answer
                texts, first.beam, first.nbest, need_attn=need_attn, warn=False)
        except Exception as err:  # whatever it is, it must not fail the other requests
            return [Rejected(f"translation failed: {type(err).__name__}: {err}".splitlines()[0], 500)
                    for _ in jobs]
        answers, start = [], 0
        for job in jobs:
            answers.append(self._answer(job, results[start : start + len(job.texts)]))
            start += len(job.texts)
        return answers

    def unbatch(self, output: list) -> list:
        return output

    def _answer(self, job: Job, results: list[list]) -> dict:
        """A job's answer from its texts' translations (each a list, best first)."""
        best = [hyps[0] for hyps in results]
        answer: dict[str, Any] = {"model": job.model, "translations": [t.text for t in best]}
        if job.nbest > 1:  # scores as translate --nbest writes them: log_prob / length penalty
            answer["nbest"] = [[{"text": t.text, "score": round(t.score, 4)} for t in hyps]
                               for hyps in results]
        choice = job.attention_layer, job.attention_head
        if job.attention:
            answer["attention"] = [attention_view(t, *choice) for t in best]
        if job.alignment:
            tokenizer = self.translators[job.model].tokenizer
            answer["alignments"] = [aligned(t, text, tokenizer, *choice)
                                    for t, text in zip(best, job.texts)]
        if job.warnings:
            answer["warnings"] = job.warnings
        return answer

    def encode_response(self, output: dict | Rejected) -> Response:
        if isinstance(output, Rejected):
            return JSONResponse({"error": output.message}, status_code=output.status)
        return JSONResponse(output)
