"use strict";
// The console's actions. Every form with data-api posts its fields to that API call as a JSON
// object, with the console token (kept for this tab only) as a bearer token, and shows the
// answer in its <output>. The reads need no script: they are links and GET forms.
(function () {
  const KEY = "delay-bridge-token";
  const token = document.getElementById("token");
  if (token) {
    token.value = sessionStorage.getItem(KEY) || "";
    token.addEventListener("input", () => sessionStorage.setItem(KEY, token.value));
  }
  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!form.dataset.api) return;
    event.preventDefault();
    const button = event.submitter;
    if (button && button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    const api = (button && button.dataset.api) || form.dataset.api;
    const options = {};
    for (const field of form.elements) {
      // A field marked data-only belongs to that call alone (reschedule's new time).
      if (!field.name || field.value === "" || (field.dataset.only && field.dataset.only !== api)) continue;
      if (field.type === "checkbox" && !field.checked) continue;
      options[field.name] = field.type === "checkbox" ? true : field.value;
    }
    if (button && button.dataset.options) Object.assign(options, JSON.parse(button.dataset.options));
    const out = form.querySelector("output");
    out.className = "";
    out.textContent = "…";
    try {
      const response = await fetch(api, {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          "Authorization": "Bearer " + (token ? token.value : ""),
        },
        body: JSON.stringify(options),
      });
      const body = await response.json();
      const lines = [...(body.output || []), ...(body.messages || [])];
      out.className = response.ok ? "ok" : "failed";
      out.textContent = response.ok ? lines.join("\n") || "done" : response.status + ": " + body.error;
    } catch (error) {
      out.className = "failed";
      out.textContent = String(error);
    }
  });
})();
