"""Screenshot of ``nmt serve``'s page with every served model ticked, for docs/usage.md (The page).

    nmt serve --checkpoint RUN_A RUN_B --port 8000 &
    python scripts/serve_screenshot.py --url http://127.0.0.1:8000 --out docs/serve_screenshot.png \
           --text "Ein Hund läuft durch den Schnee."

Drives headless Chromium (Debian's package) through Playwright, as tests/test_serve.py does:
types the sentence, ticks every model, translates and waits until the page has drawn every
answer (an ensemble's card has no heatmap). A server it cannot reach, and an answer the page
shows as an error, are one-line errors.
"""

from __future__ import annotations

import argparse
import shutil
import sys

PAGE_SECONDS = 120  # for the page to load its models, then to show every answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", default="docs/serve_screenshot.png")
    parser.add_argument("--text", default="Ein Hund läuft durch den Schnee.")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--width", type=int, default=1200)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [what for what, there in (("Chromium (apt-get install chromium)", chromium),
                                        ('Playwright (pip install -e ".[browser]")', sync_playwright))
               if there is None]
    if missing:
        print(f"error: needs {' and '.join(missing)}", file=sys.stderr)
        return 1

    from playwright.sync_api import Error as PlaywrightError

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 800})
        try:
            problem = translate_on_page(page, args.url, args.text, args.beam)
        except PlaywrightError as err:  # not reachable, or no page of nmt serve there
            problem = f"the page at {args.url}/ did not work: {err.message.splitlines()[0]}"
        if problem is None:
            page.screenshot(path=args.out, full_page=True)
        browser.close()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


def translate_on_page(page, url: str, text: str, beam: int) -> str | None:
    """Open the page, tick every model once /info has listed them, translate ``text`` and
    wait until the page is done; what went wrong in words, None where every model answered."""
    page.goto(url + "/")
    page.wait_for_selector("#models input", timeout=PAGE_SECONDS * 1000)  # after GET /info
    models = page.locator("#models input")
    for i in range(models.count()):
        models.nth(i).check()
    page.fill("#source", text)
    page.fill("#beam", str(beam))
    page.click("#translate")
    # The page says "translating..." until every answer has come, then "done" (its cards and
    # heatmaps drawn), or at once why it sent nothing.
    page.wait_for_function("!['', 'translating...'].includes("
                           "document.getElementById('status').textContent)",
                           timeout=PAGE_SECONDS * 1000)
    status = page.locator("#status").inner_text()
    errors = page.locator("#results .error").all_inner_texts()
    if status != "done":
        return f"the page translated nothing: {status}"
    return f"the page shows errors: {'; '.join(errors)}" if errors else None


if __name__ == "__main__":
    sys.exit(main())
