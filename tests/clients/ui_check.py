"""Drives the web audit view in headless Chromium (WebDriver, Debian's chromium-driver)
and prints what it saw as one JSON document; the Rust test compares it with the
audit CLI and the compaction records.

    ui_check.py BASE_URL CONVERSATION_ID SCREENSHOT_DIR

The page's own network requests come from Chromium's performance log, so the test can
check that none went to another host.
"""
import json
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

base, conversation, shots = sys.argv[1], sys.argv[2], sys.argv[3]

options = webdriver.ChromeOptions()
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1280,1800", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update",
             "--disable-default-apps", "--disable-sync"):
    options.add_argument(flag)
options.binary_location = "/usr/bin/chromium"
options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
wait = WebDriverWait(driver, 20)
out = {}
try:
    driver.get(f"{base}/handoff/ui")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "[data-conversation-id]")))
    out["listed"] = [row.get_attribute("data-conversation-id")
                     for row in driver.find_elements(By.CSS_SELECTOR, "[data-conversation-id]")]
    out["list_text"] = driver.find_element(By.ID, "app").text
    driver.save_screenshot(f"{shots}/ui-list.png")

    # From the list to the conversation, by its link, as a user would.
    row = driver.find_element(By.CSS_SELECTOR, f'[data-conversation-id="{conversation}"] a')
    row.click()
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "[data-compaction-id]")))
    out["url"] = driver.current_url
    out["compactions"] = [{
        "id": section.get_attribute("data-compaction-id"),
        "strategy": section.find_element(By.CSS_SELECTOR, '[data-field="strategy"]').text,
        "tokens_before": section.find_element(By.CSS_SELECTOR, "[data-tokens-before]").text,
        "tokens_after": section.find_element(By.CSS_SELECTOR, "[data-tokens-after]").text,
        "handoff": section.find_element(By.CSS_SELECTOR, '[data-field="handoff"]').text,
        "attempts": len(section.find_elements(By.CSS_SELECTOR, "[data-attempt]")),
    } for section in driver.find_elements(By.CSS_SELECTOR, "[data-compaction-id]")]
    out["chart_points"] = len(driver.find_elements(By.CSS_SELECTOR, 'svg[data-chart="tokens"] [data-request]'))
    out["chart_lines"] = [line.get_attribute("data-line") for line in
                          driver.find_elements(By.CSS_SELECTOR, 'svg[data-chart="tokens"] [data-line]')]
    out["chart_markers"] = len(driver.find_elements(By.CSS_SELECTOR, "svg [data-compaction-marker]"))
    out["messages"] = len(driver.find_elements(By.CSS_SELECTOR, "details[data-digest]"))
    # The bill under the chart, and what the compactions saved.
    out["bill"] = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#app [data-bill]")]
    out["saved"] = [e.get_attribute("data-saved") for e in driver.find_elements(By.CSS_SELECTOR, "#app [data-saved]")]
    driver.save_screenshot(f"{shots}/ui-conversation.png")

    # The last request, opened, shows what the client sent, read from the requests API.
    sent = driver.find_elements(By.CSS_SELECTOR, "details[data-as-sent]")[-1]
    sent.find_element(By.TAG_NAME, "summary").click()
    field = sent.find_element(By.CSS_SELECTOR, '[data-field="as-sent"]')
    wait.until(lambda _: field.text.startswith("{"))
    out["as_sent_number"] = int(sent.get_attribute("data-as-sent"))
    out["as_sent"] = json.loads(field.text)

    # The view tab has its own URL.
    driver.find_element(By.ID, "tab-view").click()
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, '[data-panel="view"]')))
    out["view_url"] = driver.current_url
    out["view_messages"] = len(driver.find_elements(By.CSS_SELECTOR, '[data-panel="view"] details'))

    # A small picture of the conversation view, for the README.
    driver.set_window_size(1100, 820)
    driver.get(out["url"])
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "[data-compaction-id]")))
    driver.save_screenshot(f"{shots}/ui-small.png")

    driver.get(f"{base}/handoff/ui")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "[data-conversation-id]")))
    time.sleep(0.2)
    requests = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            requests.append(message["params"]["request"]["url"])
    out["requests"] = requests
finally:
    driver.quit()
print(json.dumps(out))
