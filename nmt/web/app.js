// The page: list the served models (GET /info), translate the sentence with each chosen
// model (POST /translate with attention and alignment), draw each model's attention as a
// heatmap and list the word pairs read off it; a Transformer's card picks the layer and head.
"use strict";

const CELL = 22;  // pixels per attention cell
const FONT = "12px system-ui, sans-serif";
const LAST_LAYER_MEAN = {attention_layer: -1, attention_head: "mean"};  // the server's default map

async function loadModels() {
  const info = await (await fetch("/info")).json();
  const box = document.getElementById("models");
  info.model.models.forEach((m, i) => {
    const label = document.createElement("label");
    const check = document.createElement("input");
    check.type = "checkbox";
    check.value = m.name;
    check.checked = i === 0;
    label.append(check, ` ${m.name} `);
    label.title = `${describe(m)}, ${m.src_lang}->${m.tgt_lang}`;
    box.appendChild(label);
  });
  document.getElementById("beam").value = info.model.default_beam;
  return info.model.models;
}

// An ensemble has no one attention to align with (the server refuses "alignment" for it).
// ``choice``: the layer and head the map is read from.
async function translateWith(model, text, beam, choice = LAST_LAYER_MEAN) {
  const response = await fetch("/translate", {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({text: [text], beam: beam, attention: true, alignment: !model.members,
                          model: model.name, ...(model.members ? {} : choice)}),
  });
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

// Weight 0 -> white, 1 -> dark blue, linearly (the colour of a weight is comparable across maps).
function shade(w) {
  const mix = (dark) => Math.round(255 - w * (255 - dark));
  return `rgb(${mix(8)}, ${mix(48)}, ${mix(107)})`;
}

// Source pieces across the top (written upwards), target pieces down the left side.
function drawHeatmap(canvas, view) {
  const ctx = canvas.getContext("2d");
  ctx.font = FONT;
  const longest = (pieces) => Math.max(...pieces.map((p) => ctx.measureText(p).width));
  const left = longest(view.target) + 8, top = longest(view.source) + 8;
  canvas.width = left + CELL * view.source.length + 2;
  canvas.height = top + CELL * view.target.length + 2;
  ctx.font = FONT;  // resizing the canvas resets its state
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  view.weights.forEach((row, t) => row.forEach((w, s) => {
    ctx.fillStyle = shade(w);
    ctx.fillRect(left + s * CELL, top + t * CELL, CELL - 1, CELL - 1);
  }));
  ctx.fillStyle = "#222";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  view.target.forEach((p, t) => ctx.fillText(p, left - 4, top + t * CELL + CELL / 2));
  view.source.forEach((p, s) => {
    ctx.save();
    ctx.translate(left + s * CELL + CELL / 2, top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(p, 0, 0);
    ctx.restore();
  });
  canvas.dataset.drawn = `${view.target.length}x${view.source.length}`;
}

// "transformer, scaled_dot attention", or an ensemble's runs, each with its own
function describe(model) {
  if (!model.members) return `${model.family}, ${model.attention} attention`;
  const runs = model.members.map((m) => `${m.name} (${m.family}, ${m.attention})`);
  return `an ensemble of ${runs.join(" and ")} (no attention drawn)`;
}

// The whitespace characters Python's str.split() splits at, which number the words of an
// alignment (JavaScript's \s differs: it takes U+FEFF, and leaves U+0085 and U+001C-U+001F).
const WHITESPACE = /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/;

function words(text) {
  return text.split(WHITESPACE).filter((word) => word);
}

// "i-j" pairs (source word i, target word j, as translate --alignment writes them) as a
// list of "target word <- source word", in target order; words are split at whitespace.
function alignmentList(pairs, source, translation) {
  const src = words(source), tgt = words(translation);
  const list = document.createElement("div");
  list.className = "alignment";
  list.title = "each target word and the source word its attention weighs most";
  pairs.split(" ").filter((p) => p).forEach((p) => {
    const [i, j] = p.split("-").map(Number);
    const pair = document.createElement("span");
    pair.textContent = `${tgt[j]} \u2190 ${src[i]}`;
    list.appendChild(pair);
  });
  return list;
}

// Two menus, a layer ("last" or a number) and a head ("mean" or a number), for a model with
// more than one map (GET /info's attention_layers and attention_heads); ``pick`` gets the new
// choice when either changes.
function choiceMenus(model, choice, pick) {
  const box = document.createElement("div");
  box.className = "choice";
  const menu = (name, first, count, value) => {
    const select = document.createElement("select");
    select.name = name;
    select.dataset.drawn = String(value);  // the map on the card, which a failed pick goes back to
    [first, ...Array.from({length: count}, (_, i) => [i, String(i)])].forEach(([v, text]) => {
      select.add(new Option(text, v, false, String(v) === String(value)));
    });
    const label = document.createElement("label");
    label.append(`${name} `, select);
    box.appendChild(label);
    return select;
  };
  const layer = menu("layer", [-1, "last"], model.attention_layers, choice.attention_layer);
  const head = menu("head", ["mean", "mean"], model.attention_heads, choice.attention_head);
  const changed = () => pick({attention_layer: Number(layer.value),
                              attention_head: head.value === "mean" ? "mean" : Number(head.value)});
  layer.addEventListener("change", changed);
  head.addEventListener("change", changed);
  return box;
}

// A model's card; its menus (choiceMenus) translate again with the map picked and redraw it
// (only the latest pick's answer is drawn, as a click's).
function card(model, answer, source, beam, choice = LAST_LAYER_MEAN) {
  const div = document.createElement("div");
  div.className = "card";
  div.dataset.model = model.name;
  div.dataset.map = `${choice.attention_layer}:${choice.attention_head}`;  // "-1:mean": the default
  div.innerHTML = `<h2></h2><div class="meta"></div><div class="translation"></div>`;
  div.querySelector("h2").textContent = model.name;
  div.querySelector(".meta").textContent =
    `${describe(model)}, ${model.parameters.toLocaleString()} parameters, ${model.engine}`;
  div.querySelector(".translation").textContent = answer.translations[0];
  if (answer.alignments && answer.alignments[0]) {
    div.appendChild(alignmentList(answer.alignments[0], source, answer.translations[0]));
  }
  (answer.warnings || []).forEach((w) => {  // e.g. a text cut to the model's length
    const p = document.createElement("p");
    p.className = "warning";
    p.textContent = w;
    div.appendChild(p);
  });
  if (answer.attention && answer.attention[0] && model.attention_layers * model.attention_heads > 1) {
    let latestPick = 0;
    div.appendChild(choiceMenus(model, choice, async (next) => {
      const thisPick = ++latestPick;
      try {
        const again = await translateWith(model, source, beam, next);
        if (thisPick === latestPick) div.replaceWith(card(model, again, source, beam, next));
      } catch (error) {
        if (thisPick !== latestPick) return;
        div.querySelectorAll(".choice select").forEach((s) => { s.value = s.dataset.drawn; });
        let p = div.querySelector(".error");  // one error on the card: the latest pick's
        if (!p) {
          p = document.createElement("p");
          p.className = "error";
          div.appendChild(p);
        }
        p.textContent = error.message;
      }
    }));
  }
  if (answer.attention && answer.attention[0]) {
    const canvas = document.createElement("canvas");
    div.appendChild(canvas);
    drawHeatmap(canvas, answer.attention[0]);
  }
  return div;
}

let latestRun = 0;  // answers to an earlier click that arrive late are dropped

async function run(models) {
  const thisRun = ++latestRun;
  const text = document.getElementById("source").value.trim();
  const beam = parseInt(document.getElementById("beam").value, 10);
  const chosen = [...document.querySelectorAll("#models input:checked")].map((c) => c.value);
  const results = document.getElementById("results");
  const status = document.getElementById("status");
  results.replaceChildren();
  if (!text || chosen.length === 0) {
    status.textContent = "type a sentence and pick at least one model";
    return;
  }
  status.textContent = "translating...";
  const picked = chosen.map((name) => models.find((m) => m.name === name));
  const answers = await Promise.allSettled(picked.map((model) => translateWith(model, text, beam)));
  if (thisRun !== latestRun) return;
  answers.forEach((a, i) => {
    const model = picked[i];
    if (a.status === "fulfilled") {
      results.appendChild(card(model, a.value, text, beam));
    } else {
      const p = document.createElement("p");
      p.className = "error";
      p.textContent = `${chosen[i]}: ${a.reason.message}`;
      results.appendChild(p);
    }
  });
  status.textContent = "done";
}

loadModels().then((models) => {
  document.getElementById("translate").addEventListener("click", () => run(models));
});
