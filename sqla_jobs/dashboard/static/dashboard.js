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

// Live updates. A page that shows something that changes names its event stream in
// <main data-live="...">; the server sends "counts" and "jobs" events when they change.
// The stream is closed while the tab is hidden (an unseen tab costs the database
// nothing) and opened again when it is shown. EventSource reconnects by itself after a
// network error; when it gives up (the server answered with an error, e.g. while it
// restarts), we open a new one a little later.
(() => {
  const main = document.getElementById("main");
  const url = main && main.dataset.live;
  if (!url) return;
  const badge = document.getElementById("live-state");
  let source = null;
  let reopen = null;

  const say = (text) => {
    if (badge) {
      badge.hidden = false;
      badge.textContent = text;
    }
  };

  const setStatus = (holder, job) => {
    const span = document.createElement("span");
    span.className = "status status-" + job.status;
    span.textContent = job.status;
    holder.replaceChildren(span);
    if (job.stopping && job.status === "running") {
      const tag = document.createElement("span");
      tag.className = "tag";
      tag.textContent = "stopping";
      holder.append(" ", tag);
    }
  };

  const onJobs = (event) => {
    const jobs = JSON.parse(event.data);
    for (const holder of document.querySelectorAll("[data-job]")) {
      const job = jobs[holder.dataset.job];
      if (job) setStatus(holder, job);
    }
    for (const cell of document.querySelectorAll("[data-job-attempts]")) {
      const job = jobs[cell.dataset.jobAttempts];
      if (job && job.status !== "gone") cell.textContent = String(job.attempts);
    }
    // The actions drawn for the job's status (data-when) go when it changes; those of
    // its new status come with a reload, which the stale-job link offers when the new
    // status has an action this viewer may take (data-actionable, from the server).
    const shown = (job) => (job.stopping && job.status === "running" ? "running-stopping" : job.status);
    for (const form of document.querySelectorAll("form[data-when]")) {
      const job = jobs[form.dataset.whenJob];
      if (job) form.hidden = !form.dataset.when.split(" ").includes(shown(job));
    }
    for (const link of document.querySelectorAll("[data-stale-job]")) {
      const job = jobs[link.dataset.staleJob];
      if (!job) continue;
      const state = shown(job);
      const actionable = link.dataset.actionable.split(" ").includes(state);
      link.hidden = state === link.dataset.drawn || !actionable;
    }
  };

  const onCounts = (event) => {
    const counts = JSON.parse(event.data);
    for (const cell of document.querySelectorAll("[data-count]")) {
      const value = counts[cell.dataset.count];
      if (value !== undefined) cell.textContent = String(value);
    }
    // A figure turns estimated (or exact again) as its status crosses the bound.
    const estimates = counts.estimates || [];
    for (const mark of document.querySelectorAll("[data-estimate]")) {
      mark.hidden = !estimates.includes(mark.dataset.estimate);
    }
    for (const note of document.querySelectorAll("[data-estimated-note]")) {
      note.hidden = estimates.length === 0;
    }
    for (const note of document.querySelectorAll("[data-exact-note]")) {
      note.hidden = estimates.length > 0;
    }
    for (const row of document.querySelectorAll("tr[data-queue]")) {
      const queue = counts.queues[row.dataset.queue];
      for (const cell of row.querySelectorAll("[data-field]")) {
        // A queue gone from the counts has none of anything ("-" for an age).
        const value = queue ? queue[cell.dataset.field] : cell.dataset.none || 0;
        // A cell with data-link (dead) links to its jobs while there are some, as drawn.
        if (cell.dataset.link && value) {
          const link = document.createElement("a");
          link.href = cell.dataset.link;
          link.textContent = String(value);
          cell.replaceChildren(link);
        } else {
          cell.textContent = String(value);
        }
      }
    }
  };

  const close = () => {
    clearTimeout(reopen);
    if (source) source.close();
    source = null;
  };

  const open = () => {
    close();
    source = new EventSource(url);
    source.addEventListener("open", () => say("live"));
    source.addEventListener("jobs", onJobs);
    source.addEventListener("counts", onCounts);
    source.addEventListener("error", () => {
      say("reconnecting");
      if (source && source.readyState === EventSource.CLOSED) {
        reopen = setTimeout(open, 3000);
      }
    });
  };

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "hidden") {
      close();
      say("paused");
    } else {
      open();
    }
  });
  if (document.visibilityState !== "hidden") open();
})();
