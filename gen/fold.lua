-- Folding runs of identical rows for SCHEDULE.md: a block of k rows that
-- repeats for the next unit (unit index +1 or -1 in every row of the
-- block) is shown once, with its unit ranges (`layers.0-79`). Callers
-- whose units interleave (an MoE layer is two units, layers.N and
-- layers.N.experts) give a unit's number in its name as its index
-- (fold.numbered), so a block of both folds as `layers.0-31` and
-- `layers.0-31.experts`.
local fold = {}

-- items[i] = { sig = string (everything shown but the unit), unit = index }.
-- Returns runs { first = i, period = k, reps = r } covering items in order;
-- greedy: at each position the period that covers the most rows.
-- step: the unit distance between repetitions (1: consecutive units; a
-- pipeline's rounds of microbatches fold with step pp).
function fold.runs(items, max_period, step)
  max_period, step = max_period or 16, step or 1
  local out, i, n = {}, 1, #items
  while i <= n do
    local best_k, best_r = 1, 1
    for k = 1, max_period do
      if i + 2 * k - 1 > n then break end
      local r, delta = 1, nil
      while i + (r + 1) * k - 1 <= n do
        local a, b = i + (r - 1) * k, i + r * k
        local ok, d0 = true, nil
        for j = 0, k - 1 do
          local x, y = items[a + j], items[b + j]
          if x.sig ~= y.sig or not x.unit or not y.unit then ok = false; break end
          local d = y.unit - x.unit
          if d0 == nil then d0 = d elseif d ~= d0 then ok = false; break end
        end
        if ok and (d0 == step or d0 == -step) and (delta == nil or delta == d0) then
          delta = d0
          r = r + 1
        else
          break
        end
      end
      if r >= 2 and r * k > best_r * best_k then best_k, best_r = k, r end
    end
    out[#out + 1] = { first = i, period = best_k, reps = best_r }
    i = i + best_k * best_r
  end
  return out
end

-- The rows a folded table shows, in order: for each run, one row per
-- place in its block, { first = the item shown, members = the items it
-- stands for (one per repetition) }.
function fold.rows(items, max_period)
  local out = {}
  for _, run in ipairs(fold.runs(items, max_period)) do
    for j = 0, run.period - 1 do
      local members = {}
      for r = 0, run.reps - 1 do members[#members + 1] = run.first + j + r * run.period end
      out[#out + 1] = { first = run.first + j, members = members }
    end
  end
  return out
end

-- A unit's place for folding: a numbered name (`layers.7.experts`) gives
-- its template and number, so units of one template number consecutively
-- whatever units lie between them; any other name keeps its index and a
-- template of its own (it folds with nothing else).
function fold.numbered(name, index)
  local tpl, num = fold.template(name)
  if num then return tpl, num end
  return name, index
end

-- A unit name's template: its last run of digits replaced by '#'.
function fold.template(name)
  local pre, num, post = name:match("^(.-)(%d+)([^%d]*)$")
  if not pre then return name, nil end
  return pre .. "#" .. post, tonumber(num)
end

-- Names of a run of units (in the order met): `layers.0-79` when they
-- number consecutively under one template, else `first .. last (n units)`.
function fold.unit_range(names)
  if #names == 1 then return names[1] end
  local tpl, a = fold.template(names[1])
  local _, b = fold.template(names[#names])
  if a and b and math.abs(b - a) == #names - 1 then
    local ok = true
    for i, n in ipairs(names) do
      local t, v = fold.template(n)
      if t ~= tpl or v ~= a + (i - 1) * (b >= a and 1 or -1) then ok = false; break end
    end
    if ok then
      local lo, hi = math.min(a, b), math.max(a, b)
      local range = b >= a and (lo .. "-" .. hi) or (hi .. "-" .. lo)
      return (tpl:gsub("#", range, 1))
    end
  end
  return string.format("%s .. %s (%d units)", names[1], names[#names], #names)
end

return fold
