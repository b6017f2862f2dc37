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

  // The workflow page: its header counts are the drawn ones plus the changes of the
  // steps on this page (a step on another page changes them at the next load), and a
  // step's "Waits on" drops each dependency on this page that ended; a step that ended
  // waits on nothing.
  const ended = ["done", "dead", "cancelled", "gone"];
  const statusSpan = (name) => {
    const span = document.createElement("span");
    span.className = "status status-" + name;
    span.textContent = name;
    return span;
  };
  const onWorkflow = (jobs) => {
    const holder = document.querySelector("[data-flow-counts]");
    if (!holder) return;
    const counts = JSON.parse(holder.dataset.flowCounts);
    const now = {};
    for (const row of document.querySelectorAll("tr[data-step]")) {
      const job = jobs[row.dataset.step];
      // A step gone from jobs was archived (same status) or deleted: counted as drawn.
      const status = job && job.status !== "gone" ? job.status : row.dataset.drawn;
      now[row.dataset.step] = job ? job.status : row.dataset.drawn;
      if (status !== row.dataset.drawn) {
        counts[row.dataset.drawn] = (counts[row.dataset.drawn] || 0) - 1;
        counts[status] = (counts[status] || 0) + 1;
      }
    }
    const parts = [];
    for (const name of Object.keys(counts).sort()) {
      if (counts[name] <= 0) continue;
      if (parts.length) parts.push(", ");
      parts.push(statusSpan(name), " " + String(counts[name]));
    }
    holder.replaceChildren(...parts);
    const finished = document.querySelector("[data-flow-finished]");
    if (finished) finished.hidden = ["waiting", "queued", "running"].some((s) => counts[s] > 0);
    for (const cell of document.querySelectorAll("td[data-waits]")) {
      const own = now[cell.closest("tr").dataset.step];
      const more = Number(cell.dataset.more || 0);
      const left = ended.includes(own)
        ? []
        : JSON.parse(cell.dataset.waits).filter(([, id]) => id === null || !ended.includes(now[id]));
      const parts = [];
      for (const [name, id] of left) {
        if (parts.length) parts.push(", ");
        if (id === null) {
          parts.push(name);
        } else {
          const link = document.createElement("a");
          link.href = "#step-" + id;
          link.textContent = name;
          parts.push(link);
        }
      }
      if (more && !ended.includes(own)) parts.push(" and " + more + " more");
      if (!parts.length) parts.push("-");
      cell.replaceChildren(...parts);
    }
  };

  const onJobs = (event) => {
    const jobs = JSON.parse(event.data);
    onWorkflow(jobs);
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
