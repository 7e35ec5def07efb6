package main

import (
	"fmt"
	"sort"
	"strings"
)

// redriveSummary is the summary line of a redrive of topic.
func redriveSummary(topic, verb string, st *redriveStats) string {
	if st.matched == 0 {
		return fmt.Sprintf("redrive: no record of %s matched; nothing to send", topic)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "redrive: %s %d of %s from %s", verb, st.sent, plural(st.matched, "matching record"), topic)
	if len(st.perTopic) > 0 {
		ts := make([]string, 0, len(st.perTopic))
		for t := range st.perTopic {
			ts = append(ts, t)
		}
		sort.Strings(ts)
		for i, t := range ts {
			ts[i] = fmt.Sprintf("%s (%d)", t, st.perTopic[t])
		}
		fmt.Fprintf(&b, " to %s", strings.Join(ts, ", "))
	}
	fmt.Fprintf(&b, ", skipped %d", st.skipped)
	if st.resolved > 0 {
		fmt.Fprintf(&b, ", %s resolved by kscope dlt skip (not sent)", plural(st.resolved, "dead letter"))
	}
	switch {
	case st.copies == 1:
		b.WriteString(", 1 later copy of an identity sent once")
	case st.copies > 1:
		fmt.Fprintf(&b, ", %d later copies of identities sent once", st.copies)
	}
	return b.String()
}
