"""Without Playwright or Chromium the browser tests fail and say what to install; only
ATTENTION_LAB_SKIP_BROWSER=1 skips them (tests/browser_utils.require_browser)."""

import sys

import pytest

import browser_utils


def test_missing_chromium_fails_with_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv(browser_utils.SKIP_VAR, raising=False)
    monkeypatch.setattr(browser_utils, "CHROMIUM", str(tmp_path / "no-chromium"))
    with pytest.raises(pytest.fail.Exception) as failed:
        browser_utils.require_browser()
    msg = str(failed.value)
    assert f"no Chromium at {tmp_path / 'no-chromium'}" in msg
    assert "apt-get install chromium" in msg and "ATTENTION_LAB_SKIP_BROWSER=1" in msg


def test_missing_playwright_fails_with_what_to_install(monkeypatch):
    monkeypatch.delenv(browser_utils.SKIP_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # import raises ImportError
    with pytest.raises(pytest.fail.Exception, match=r"playwright package cannot be imported.*pip install -e"):
        browser_utils.require_browser()


@pytest.mark.parametrize("value, skips", [("1", True), ("0", False), ("", False)])
def test_only_the_opt_out_skips(monkeypatch, tmp_path, value, skips):
    monkeypatch.setenv(browser_utils.SKIP_VAR, value)
    monkeypatch.setattr(browser_utils, "CHROMIUM", str(tmp_path / "no-chromium"))
    with pytest.raises(pytest.skip.Exception if skips else pytest.fail.Exception):
        browser_utils.require_browser()


def test_present_browser_passes():
    """Wherever `make test` installed them, both are present: no skip, no failure (with the
    opt-out set, this skips like every browser test)."""
    browser_utils.require_browser()
    assert browser_utils.browser_missing() is None
