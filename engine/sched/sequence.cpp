#include "kvfleet/sequence.h"

namespace kvfleet {

const char* to_string(SeqStatus status) {
  switch (status) {
    case SeqStatus::waiting: return "waiting";
    case SeqStatus::running: return "running";
    case SeqStatus::preempted: return "preempted";
    case SeqStatus::finished: return "finished";
  }
  return "unknown";
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::aborted: return "aborted";
  }
  return "unknown";
}

}  // namespace kvfleet
