package route

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// kscopeInfix is in the name of every topic kscope names by its
// convention: retry topics ("<group>.kscope-retry-<delay>"), dead-letter
// topics ("<group>.kscope-dlt") and version changelogs
// ("<group>.kscope-versions.<topic>"), of any group.
const kscopeInfix = ".kscope-"

// Anchored returns the regular expression that matches exactly topic, as
// a regex-consuming client needs every named topic.
func Anchored(topic string) string { return "^" + regexp.QuoteMeta(topic) + "$" }

// Exclusions returns regular expressions (for franz-go's
// kgo.ConsumeExcludeTopics, which wins over every consumed expression)
// that match every topic named by kscope's convention except the topics
// in keep (the runner's named topics and its own retry topics), and the
// topics of extra (a dead-letter topic named otherwise) not in keep. A
// user's pattern then never consumes a retry, dead-letter or changelog
// topic as a source topic.
func Exclusions(keep []string, extra ...string) []string {
	prefixes := map[string]*trie{}
	root := &trie{}
	for _, k := range keep {
		i := strings.Index(k, kscopeInfix)
		if i < 0 {
			continue
		}
		a, b := k[:i], k[i+len(kscopeInfix):]
		root.add(a)
		if prefixes[a] == nil {
			prefixes[a] = &trie{}
		}
		prefixes[a].add(b)
	}
	infix := regexp.QuoteMeta(kscopeInfix)
	var out []string
	if len(prefixes) == 0 {
		out = append(out, infix)
	} else {
		// A topic whose part before the infix is none of keep's, or ...
		out = append(out, "(?s)^"+root.notIn()+infix)
		// ... one of keep's prefixes with a part after it that is not.
		for _, a := range slices.Sorted(mapKeys(prefixes)) {
			out = append(out, "(?s)^"+regexp.QuoteMeta(a)+infix+prefixes[a].notIn()+"$")
		}
	}
	for _, e := range extra {
		if e != "" && !slices.Contains(keep, e) {
			out = append(out, Anchored(e))
		}
	}
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// trie is a set of strings, by rune.
type trie struct {
	end  bool
	kids map[rune]*trie
}

func (t *trie) add(s string) {
	for _, c := range s {
		if t.kids == nil {
			t.kids = map[rune]*trie{}
		}
		k := t.kids[c]
		if k == nil {
			k = &trie{}
			t.kids[c] = k
		}
		t = k
	}
	t.end = true
}

// notIn returns a regular expression (RE2 has no lookahead) that matches,
// whole, every string that is not in the set t holds.
func (t *trie) notIn() string {
	var alts []string
	if !t.end {
		alts = append(alts, "") // the empty rest
	}
	if len(t.kids) == 0 {
		alts = append(alts, ".+")
	} else {
		cs := make([]rune, 0, len(t.kids))
		for c := range t.kids {
			cs = append(cs, c)
		}
		slices.Sort(cs)
		var class strings.Builder
		for _, c := range cs {
			fmt.Fprintf(&class, `\x{%x}`, c)
		}
		alts = append(alts, "[^"+class.String()+"].*")
		for _, c := range cs {
			alts = append(alts, regexp.QuoteMeta(string(c))+t.kids[c].notIn())
		}
	}
	return "(?:" + strings.Join(alts, "|") + ")"
}
