// explain.h: one training step's memory, narrated (engine_train --explain) and drawn (the timeline SVG).
//
// Both read the ledger's history with its detail on (engine::Ledger::set_detail): every allocation and free of the
// step in order, each with its tensor (dtype and shape), bytes, category and why it exists and when it dies. The
// "why" is what the engine itself recorded, not text per op: a block saved for backward carries the name of the op
// whose backward rule saved it (graph/autograd.cpp's record()), a gradient, an optimizer state, the batch and a
// workspace are their ledger categories, and every free carries the phase and op that were running.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/ledger.h"

namespace tools {

// One event of a step as explain_markdown lists it: the block, allocation or free, the live bytes after it.
struct ExplainRow {
  int64_t seq = 0;
  bool alloc = false;
  const engine::BlockInfo* block = nullptr;  // into the history vector given to explain_rows
  size_t live_after = 0;
};
// The events of `history` (Ledger::history()) after `from_seq`, with `live_before` bytes live before them.
std::vector<ExplainRow> explain_rows(const std::vector<engine::BlockInfo>& history, int64_t from_seq,
                                     size_t live_before);
// Why a block exists (its final category, owner and the reasons autograd recorded), as the table says it.
std::string explain_why(const engine::BlockInfo& b);

// The events after sequence number `from_seq` (a step's start: Ledger::sequence() then), with `live_before` bytes
// live before them: a table of every allocation and free in order (grouped: the phase and module/op column is
// filled where it changes), the running live bytes, then the step's peak and the blocks alive at it.
std::string explain_markdown(const engine::Ledger& ledger, int64_t from_seq, size_t live_before,
                             const std::string& title);

// Live bytes over the events after `from_seq`, stacked by category, each phase shaded and the peak marked: an SVG
// of `width` x `height` pixels. The x axis is allocation order, or with `times` (Device::event_times(): sequence
// number -> milliseconds) the device's time, live bytes then held flat between events (an event without a stamp
// takes the last stamp before it).
std::string memory_timeline_svg(const engine::Ledger& ledger, int64_t from_seq, const std::string& title,
                                const std::vector<std::pair<int64_t, double>>& times = {}, int width = 960,
                                int height = 420);

}  // namespace tools
