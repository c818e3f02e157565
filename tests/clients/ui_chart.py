"""Reads the web audit view's chart of one conversation in headless Chromium
(WebDriver, Debian's chromium-driver) and prints what it drew as one JSON document:
each request's dot (its number, estimate, trigger, why it was over), the provider's
squares, the "compacted here" marks and the prepared-waiting bands. The Rust test
compares them with the log.

    HANDOFF_URL=... ui_chart.py CONVERSATION_ID SCREENSHOT_DIR
"""
import json
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

base, conversation, shots = os.environ["HANDOFF_URL"], sys.argv[1], sys.argv[2]

options = webdriver.ChromeOptions()
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1280,1400", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update",
             "--disable-default-apps", "--disable-sync"):
    options.add_argument(flag)
options.binary_location = "/usr/bin/chromium"
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
wait = WebDriverWait(driver, 20)
out = {}
try:
    driver.get(f"{base}/handoff/ui#/c/{conversation}")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, 'svg[data-chart="tokens"] [data-request]')))
    chart = driver.find_element(By.CSS_SELECTOR, 'svg[data-chart="tokens"]')
    attr = lambda el, name: el.get_attribute(name)
    out["points"] = [{
        "number": attr(dot, "data-number"),
        "estimate": attr(dot, "data-estimate"),
        "trigger": attr(dot, "data-trigger"),
        "budget": attr(dot, "data-budget"),
        "over": attr(dot, "data-over"),
        "estimated": attr(dot, "data-estimated"),
        "refused": attr(dot, "data-refused"),
        "title": dot.find_element(By.TAG_NAME, "title").get_attribute("textContent"),
    } for dot in chart.find_elements(By.CSS_SELECTOR, "[data-request]")]
    out["provider"] = [attr(square, "data-provider")
                       for square in chart.find_elements(By.CSS_SELECTOR, "[data-provider-point]")]
    out["markers"] = [{"compaction": attr(m, "data-compaction-marker"), "request": attr(m, "data-request-number")}
                      for m in chart.find_elements(By.CSS_SELECTOR, "[data-compaction-marker]")]
    out["prepared"] = [{"id": attr(b, "data-prepared"), "waiting_from": attr(b, "data-waiting-from"),
                        "adopted_at": attr(b, "data-adopted-at")}
                       for b in chart.find_elements(By.CSS_SELECTOR, "[data-prepared]")]
    out["preparing"] = [{"id": attr(b, "data-preparing"), "started_from": attr(b, "data-started-from")}
                        for b in chart.find_elements(By.CSS_SELECTOR, "[data-preparing]")]
    out["adopted"] = [attr(line, "data-adopted") for line in chart.find_elements(By.CSS_SELECTOR, "[data-adopted]")]
    out["lines"] = [attr(line, "data-line") for line in chart.find_elements(By.CSS_SELECTOR, "[data-line]")]
    out["caption"] = driver.find_element(By.CSS_SELECTOR, "figure figcaption").text
    driver.save_screenshot(f"{shots}/ui-chart-prepared.png")
finally:
    driver.quit()
print(json.dumps(out))
