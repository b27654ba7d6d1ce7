import sys; sys.path.insert(0, "tests")
from pathlib import Path
from playwright.sync_api import sync_playwright
from browser_utils import start_server, launch, wait_idle
import tempfile
srv = start_server(Path(tempfile.mkdtemp()))
try:
    with sync_playwright() as p:
        b = launch(p); pg = b.new_page(viewport={"width": 1400, "height": 2400})
        pg.goto(srv.url + "/?model=toy-translate&text=the+old+man")
        wait_idle(pg, timeout=120000)
        print(pg.eval_on_selector_all('[data-testid="stPageLink-NavLink"]', "els => els.map(e => e.outerHTML.slice(0,200))"))
        pg.screenshot(path="/tmp/stop1.png", full_page=True)
        b.close()
finally:
    srv.stop()
