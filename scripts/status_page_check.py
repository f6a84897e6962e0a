"""Opens ultr's status page in headless Chromium through WebDriver (Debian's chromium and
chromium-driver, Python's selenium) and prints what a reader sees as JSON; saves a screenshot.

Usage: status_page_check.py URL SCREENSHOT.png
Run by tests/deployment/service.rs (status_page_in_headless_chromium_*), which checks the values."""
import json
import os
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def main():
    url, screenshot = sys.argv[1], sys.argv[2]
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download a browser
    options = Options()
    options.binary_location = os.environ.get("ULTR_CHROMIUM", "/usr/bin/chromium")
    profile = tempfile.mkdtemp(prefix="ultr-chromium-")
    # The flags that keep Chromium off the network it cannot reach here, and off a sandbox root lacks.
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,900"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(os.environ.get("ULTR_CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
    try:
        driver.get(url)
        css = lambda sel: driver.find_elements(By.CSS_SELECTOR, sel)
        identified = css("#verdict-identified")
        out = {
            "title": driver.title,
            "sections": [s.get_attribute("id") for s in css("section")],
            "identified": identified[0].get_attribute("data-value") if identified else None,
            "identified_text": identified[0].text if identified else None,
            "theta_points": len(css("#theta-plot circle.theta-point")),
            "theta_intervals_drawn": len(css("#theta-plot line.interval")),
            "swap_edges": len(css("#swap-graph line.swap-edge")),
            # As written in the page (the test parses them exactly).
            "theta": {td.get_attribute("data-position"): td.get_attribute("data-value") for td in css("td.theta")},
            "theta_shown": {td.get_attribute("data-position"): td.text for td in css("td.theta")},
            "model_id": css("#model-id")[0].text if css("#model-id") else None,
            "query_ids": [td.text for td in css("td.query-id")],
            "script_elements": len(driver.find_elements(By.TAG_NAME, "script")),
            "plan_needed": {td.get_attribute("data-position"): td.get_attribute("data-value") for td in css("td.plan-needed")},
            "plan_swaps": css("#plan-swaps")[0].text if css("#plan-swaps") else None,
            "alert_conditions": css("#alert-conditions")[0].text if css("#alert-conditions") else None,
        }
        # The whole page in the screenshot, then the same page in a phone-wide window.
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, min(max(height + 40, 900), 4000))
        driver.save_screenshot(screenshot)
        driver.set_window_size(400, 900)
        out["narrow_overflow_px"] = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        print(json.dumps(out))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
