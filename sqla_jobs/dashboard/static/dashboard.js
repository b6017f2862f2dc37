// sqla_jobs dashboard: the only script, loaded from the dashboard's own static files
// (the Content-Security-Policy allows no inline script). Every page works without it;
// with it, destructive actions ask for confirmation first.
"use strict";

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement)) return;
  const question = form.dataset.confirm;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
