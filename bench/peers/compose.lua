-- wrk script: every request a new text, composed as texts.py composes text number g.
--   wrk -t T -c C -d Ds -s compose.lua URL -- DATA_FILE START PATH T
-- Thread t (0-based) of T sends texts START + t, START + t + T, START + t + 2T, ...
-- DATA_FILE (written by texts.py): "short" then "lang<TAB>phrase" lines, "long" then words, or
-- "list" then one whole text a line (text g is line g mod the count).
-- done() prints one line "PEERS_JSON {...}" with counts and latency percentiles (us).

local LONG_STRIDE, LONG_MIX, LONG_MOD, LONG_MIN_WORDS, LONG_SPAN = 7919, 40503, 65521, 10, 51

local started = 0
tid = 0

function setup(thread)
   thread:set("tid", started)
   started = started + 1
end

local kind, start, path
local phrases, langs, position, by_lang, words, texts = {}, {}, {}, {}, {}, {}
local k, nthreads = 0, 1
local headers = {["Content-Type"] = "application/json"}

function init(args)
   local file = assert(io.open(args[1], "r"))
   kind = file:read("*l")
   for line in file:lines() do
      if kind == "short" then
         local lang, phrase = line:match("^(%d+)\t(.*)$")
         lang = tonumber(lang)
         table.insert(phrases, phrase)
         table.insert(langs, lang)
         by_lang[lang] = by_lang[lang] or {}
         table.insert(position, #by_lang[lang])
         table.insert(by_lang[lang], #phrases - 1)
      elseif kind == "list" then
         table.insert(texts, line)
      else
         table.insert(words, line)
      end
   end
   file:close()
   start = tonumber(args[2])
   path = args[3]
   nthreads = tonumber(args[4])
end

local function compose(g)
   if kind == "list" then
      return texts[(g % #texts) + 1]
   end
   if kind == "short" then
      local n = #phrases
      local a, r = g % n, math.floor(g / n)
      local same = by_lang[langs[a + 1]]
      local b = same[((position[a + 1] + 1 + r) % #same) + 1]
      return phrases[a + 1] .. " " .. phrases[b + 1]
   end
   local m = #words
   local s = (g * LONG_STRIDE) % m
   local count = LONG_MIN_WORDS + ((g * LONG_MIX) % LONG_MOD) % LONG_SPAN
   local out = {}
   for i = 0, count - 1 do
      out[i + 1] = words[((s + i) % m) + 1]
   end
   return table.concat(out, " ")
end

local function json_string(s)
   return '"' .. s:gsub('\\', '\\\\'):gsub('"', '\\"') .. '"'
end

function request()
   local g = start + k * nthreads + tid
   k = k + 1
   return wrk.format("POST", path, headers, '{"texts": [' .. json_string(compose(g)) .. ']}')
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'PEERS_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, ' ..
      '"read": %d, "write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, ' ..
      '"p99_us": %d, "max_us": %d, "mean_us": %.1f}\n',
      summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
      e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean))
end
