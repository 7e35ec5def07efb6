package consumer

import (
	"errors"
	"slices"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/handlerchain"
)

// retryReason is the detail of a retry in place (hook.EventRetry): "timeout"
// for a handler call that ran past its deadline (ErrHandlerTimeout), else
// the failure's class.
func retryReason(err error, class Class) string {
	if errors.Is(err, handlerchain.ErrTimeout) {
		return "timeout"
	}
	return class.String()
}

// commitTopics returns the topics of offsets, a commit's offsets by topic,
// each once and sorted, for hook.Commit.Topics.
func commitTopics[P any](offsets map[string]P) []string {
	if len(offsets) == 0 {
		return nil
	}
	out := make([]string, 0, len(offsets))
	for t := range offsets {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// wantsCommit reports whether a hook observes offset commits.
func (o *observer) wantsCommit() bool { return o != nil && len(o.commit) > 0 }

// duplicateSource is the detail of hook.EventDuplicate for the AtLeastOnce
// scope's dedupe store.
const duplicateSource = hook.DuplicateDedupeStore
