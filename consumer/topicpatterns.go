package consumer

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/route"
)

// DefaultPatternRefresh is how often a runner with Config.TopicPatterns
// refreshes the cluster's metadata (kgo.MetadataMaxAge), unless
// Config.ClientOptions set it: a topic created after the runner started
// is consumed within about this long (franz-go's default is 5 minutes).
const DefaultPatternRefresh = 30 * time.Second

// validatePatterns reports each pattern of TopicPatterns that cannot be
// consumed.
func validatePatterns(patterns []string, bad func(field, format string, args ...any)) {
	for i, p := range patterns {
		switch _, err := regexp.Compile(p); {
		case strings.TrimSpace(p) == "":
			bad("TopicPatterns", "holds an empty pattern, which would match every topic; remove it, or write the expression that matches the topics to consume (\".*\" for all)")
		case err != nil:
			bad("TopicPatterns", "%q is not a regular expression (%v); fix its syntax (Go's regexp, as franz-go's kgo.ConsumeRegex reads it)", p, err)
		case slices.Contains(patterns[:i], p):
			bad("TopicPatterns", "lists %q twice; list each pattern once", p)
		}
	}
}

// patternDefaults are the client options a runner with topic patterns
// sets before the user's: a metadata refresh that finds new topics within
// DefaultPatternRefresh.
func (r *Runner) patternDefaults() []kgo.Opt {
	if len(r.cfg.TopicPatterns) == 0 {
		return nil
	}
	return []kgo.Opt{kgo.MetadataMaxAge(DefaultPatternRefresh)}
}

// consumeOptions are the client options that say what the client consumes
// from its creation: the named topics and the scope's delay topics, and,
// with topic patterns, every topic they match but kscope's own (franz-go's
// regex consuming, in which every consumed topic is an expression: the
// named ones are anchored and quoted).
func (r *Runner) consumeOptions() []kgo.Opt {
	topics := r.consumedAtStart()
	if len(r.cfg.TopicPatterns) == 0 || r.txs != nil {
		return []kgo.Opt{kgo.ConsumeTopics(topics...)}
	}
	exprs := make([]string, 0, len(topics)+len(r.cfg.TopicPatterns))
	for _, t := range topics {
		exprs = append(exprs, route.Anchored(t))
	}
	exprs = append(exprs, r.cfg.TopicPatterns...)
	return []kgo.Opt{
		kgo.ConsumeRegex(),
		kgo.ConsumeTopics(exprs...),
		kgo.ConsumeExcludeTopics(route.Exclusions(topics, r.cfg.Failures.DeadLetterTopic)...),
	}
}

// sourceTopics returns the topics cfg consumes that exist now: the named
// ones, and those its patterns match (kscope's own aside). The failure
// topics a runner creates get as many partitions as the largest of them.
// A listing that fails leaves the named ones.
func sourceTopics(ctx context.Context, cl *kgo.Client, cfg Config) []string {
	if len(cfg.TopicPatterns) == 0 {
		return cfg.Topics
	}
	all, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		return cfg.Topics
	}
	var res []*regexp.Regexp
	for _, p := range cfg.TopicPatterns {
		res = append(res, regexp.MustCompile(p)) // validated by New
	}
	var ex []*regexp.Regexp
	for _, e := range route.Exclusions(cfg.Topics, cfg.Failures.DeadLetterTopic) {
		ex = append(ex, regexp.MustCompile(e))
	}
	out := slices.Clone(cfg.Topics)
	for _, t := range all.Names() {
		match := func(re *regexp.Regexp) bool { return re.MatchString(t) }
		if !slices.Contains(out, t) && slices.ContainsFunc(res, match) && !slices.ContainsFunc(ex, match) {
			out = append(out, t)
		}
	}
	return out
}
