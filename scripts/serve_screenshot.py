"""Screenshot of ``nmt serve``'s page with every served model ticked, for the README.

    nmt serve --checkpoint RUN_A RUN_B --port 8000 &
    python scripts/serve_screenshot.py --url http://127.0.0.1:8000 --out docs/serve_screenshot.png \
           --text "Ein Hund läuft durch den Schnee."

Drives headless Chromium (Debian's package) through Playwright, as tests/test_serve.py does:
types the sentence, ticks every model, translates and waits until each model's heatmap is drawn.
"""

from __future__ import annotations

import argparse
import shutil
import sys


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

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 800})
        page.goto(args.url + "/")
        models = page.locator("#models input")
        for i in range(models.count()):
            models.nth(i).check()
        page.fill("#source", args.text)
        page.fill("#beam", str(args.beam))
        page.click("#translate")
        for i in range(models.count()):
            name = models.nth(i).get_attribute("value")
            page.wait_for_selector(f".card[data-model={name}] canvas[data-drawn]", timeout=120_000)
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
