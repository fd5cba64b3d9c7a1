"""``nmt serve``: translation over HTTP with LitServe, and a page that shows the attention.

A thin adapter around ``Translator`` (or ``ctranslate2_translator.CTranslate2Translator``).
LitServe runs one inference worker (one per GPU on a host with several); requests that
arrive within ``BATCH_TIMEOUT`` seconds of each other (up to ``max_batch`` of them) reach
``predict`` together, and the texts of all those that ask for the same model, beam, attention
(or alignment) and nbest are decoded in one ``translate`` call: one batched beam search per
length bucket.

    POST /translate  {"text": ["...", ...], "beam": 5, "attention": false, "alignment": false,
                      "model": NAME, "nbest": 1, "attention_layer": -1, "attention_head": "mean"}
                     (all but text optional; null, as a field left out, is the default)
        -> {"model": NAME, "translations": ["...", ...],
            "nbest": [[{"text": "...", "score": -0.61}, ...], ...],  # if nbest > 1, best first
            "attention": [{"source": [...], "target": [...], "weights": [[...]]}, ...],  # if asked
                                                               # (each null for an ensemble)
            "alignments": ["0-0 1-1 ...", ...],  # if asked: the best translation's word pairs
            "warnings": ["text 2 has 900 pieces; truncated to 511"]}                       # if any
    GET /health      "ok" once the worker is ready (LitServe's)
    GET /info        {"model": {"models": [{name, family, attention, src_lang, tgt_lang,
                      parameters, engine, attention_layers, attention_heads, [members]}, ...],
                      ...}, "server": {...}} (LitServe's)
    GET /            the web page (nmt/web/)

A bad request gets a 400 with {"error": "<one line>"}. It is checked in the worker but never
raises there: LitServe answers every request of a batch with the error a batch raises, so a
rejected request travels through the batch as a ``Rejected`` and only its own answer is a 400.
"""

from nmt.serve.server import build_server, serve

__all__ = ["build_server", "serve"]
