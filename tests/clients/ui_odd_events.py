"""Opens one conversation in the web audit view (headless Chromium) and prints what
the timeline shows as JSON: the page text, the messages drawn, the events drawn raw.

    ui_odd_events.py BASE_URL CONVERSATION_ID
"""
import json
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

base, conversation = sys.argv[1], sys.argv[2]
options = webdriver.ChromeOptions()
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", "--disable-background-networking"):
    options.add_argument(flag)
options.binary_location = "/usr/bin/chromium"
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
out = {}
try:
    driver.get(f"{base}/handoff/ui#/c/{conversation}")
    WebDriverWait(driver, 20).until(ready.presence_of_element_located(
        (By.CSS_SELECTOR, '[data-panel="timeline"], .error')))
    out["text"] = driver.find_element(By.ID, "app").text
    out["messages"] = len(driver.find_elements(By.CSS_SELECTOR, "details[data-digest]"))
    # A log that does not verify says so before anything else.
    out["problems"] = [e.text for e in driver.find_elements(By.CSS_SELECTOR, '#app [role="alert"].problems')]
    # The bill line under the chart.
    out["bill"] = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#app [data-bill]")]
    # Where the provider compacted: a dashed mark on the chart, by request number.
    out["provider_marks"] = [e.get_attribute("data-provider-compaction")
                             for e in driver.find_elements(By.CSS_SELECTOR, "svg [data-provider-compaction]")]
    out["raw"] = len(driver.find_elements(By.CSS_SELECTOR, '[data-unrenderable="true"]'))
    # What a client sent is text: no element of its making, no script of its making ran.
    out["injected"] = len(driver.find_elements(By.CSS_SELECTOR, "#app img, #app script, #app iframe"))
    out["pwned"] = driver.execute_script("return window.__pwned || 0")
finally:
    driver.quit()
print(json.dumps(out))
