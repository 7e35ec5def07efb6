package dbscope

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// consumerCheckTimeout bounds checkConsumerName's lookups.
const consumerCheckTimeout = 10 * time.Second

// consumerCheckMax is how many other consumers of the inbox
// checkConsumerName looks at.
const consumerCheckMax = 20

// consumerKnown reports whether the consumer has a row in one of the
// tables of the scope's table prefix: whether it ran on them before.
func (s *dbScope) consumerKnown(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, consumerCheckTimeout)
	defer cancel()
	return hasConsumerRows(ctx, s.o.Pool, s.o.TablePrefix, s.o.Consumer)
}

// hasConsumerRows reports whether consumer has a row in the inbox,
// offsets, parked, waiting or key_versions table of prefix p.
func hasConsumerRows(ctx context.Context, db *pgxpool.Pool, p, consumer string) (bool, error) {
	var known bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+p+`inbox WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM `+p+`offsets WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM `+p+`parked WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM `+p+`waiting WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM `+p+`key_versions WHERE consumer = $1)`, consumer).Scan(&known)
	return known, err
}

// checkConsumerName is Start's check for a runner whose Options.Consumer
// was left to default to its group id, so that renaming the group renames
// the inbox's namespace too; Start calls it for a consumer with no row in
// kscope's tables (consumerKnown). On the first start of such a consumer
// (no committed offset of its group on its topics either) the runner
// starts from the reset offset and applies every record Kafka still holds, deduplicated only against its own empty
// namespace. When another consumer of the inbox read the same topics (its
// group has committed offsets on them, or its stored offsets, parked or
// waiting records or key versions name them) that is most likely the
// group this one was renamed from, whose effects would all be applied
// again: it returns a *consumer.ConfigError on Consumer that names it and
// says what to set. When other consumers have inbox rows but nothing ties
// them to these topics, it logs a warning that names them. A lookup that
// fails is returned as err, which Start logs.
func (s *dbScope) checkConsumerName(ctx context.Context) (*consumer.ConfigError, error) {
	if !s.defaultConsumer {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, consumerCheckTimeout)
	defer cancel()
	p, name, topics := s.o.TablePrefix, s.o.Consumer, s.topics
	others, err := s.otherConsumers(ctx)
	if err != nil || len(others) == 0 {
		return nil, err
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, s.clientOpts...), kgo.SeedBrokers(s.brokers...))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if mine, err := groupCommitted(ctx, adm, s.group, topics); err != nil || mine {
		return nil, err // not the group's first start
	}
	var why []string
	var first string
	for _, c := range others {
		stored, err := storesTopics(ctx, s.o.Pool, p, c, topics)
		if err != nil {
			return nil, err
		}
		group, err := groupCommitted(ctx, adm, c, topics)
		if err != nil {
			return nil, err
		}
		switch {
		case group:
			why = append(why, fmt.Sprintf("%q (a group of that name has committed offsets on these topics)", c))
		case stored:
			why = append(why, fmt.Sprintf("%q (its stored offsets, parked or waiting records or key versions name them)", c))
		default:
			continue
		}
		if first == "" {
			first = c
		}
	}
	if len(why) == 0 {
		s.log.Warn("kscope: this consumer has no row in the inbox and its group no committed offset: it starts from the reset offset (the earliest by default) "+
			"and applies every record its topics still hold. The inbox holds the records of other consumers: if this group replaces one of them "+
			"(a renamed group), stop it and set dbscope.Options.Consumer to that consumer's name, or its effects are applied again; "+
			"set Consumer explicitly to silence this", "consumer", name, "topics", topics, "other_consumers", others)
		return nil, nil
	}
	return s.renamedError(why, first), nil
}

// otherConsumers returns the inbox's consumers other than this one, at
// most consumerCheckMax of them: one index probe each (a loose index scan
// of its primary key).
func (s *dbScope) otherConsumers(ctx context.Context) ([]string, error) {
	p := s.o.TablePrefix
	rows, err := s.o.Pool.Query(ctx, `WITH RECURSIVE c AS (
			(SELECT consumer FROM `+p+`inbox ORDER BY consumer LIMIT 1)
			UNION ALL
			SELECT (SELECT i.consumer FROM `+p+`inbox AS i WHERE i.consumer > c.consumer ORDER BY i.consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL)
		SELECT consumer FROM c WHERE consumer IS NOT NULL AND consumer <> $1 LIMIT $2`, s.o.Consumer, consumerCheckMax)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// groupCommitted reports whether group has a committed offset on one of
// topics; a group that does not exist has none.
func groupCommitted(ctx context.Context, adm *kadm.Client, group string, topics []string) (bool, error) {
	got, err := adm.FetchOffsetsForTopics(ctx, group, topics...)
	if err == nil {
		err = got.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return false, nil // no such group (kfake says so; Kafka returns no offsets)
	}
	if err != nil {
		return false, err
	}
	some := false
	got.Each(func(o kadm.OffsetResponse) { some = some || o.At >= 0 })
	return some, nil
}

// storesTopics reports whether consumer's stored offsets, parked or
// waiting records or key versions, in the tables of prefix p, name one
// of topics.
func storesTopics(ctx context.Context, db *pgxpool.Pool, p, consumer string, topics []string) (bool, error) {
	var stored bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+p+`offsets WHERE consumer = $1 AND topic = ANY($2::text[]))
			OR EXISTS (SELECT 1 FROM `+p+`parked WHERE consumer = $1 AND topic = ANY($2::text[]))
			OR EXISTS (SELECT 1 FROM `+p+`waiting WHERE consumer = $1 AND topic = ANY($2::text[]))
			OR EXISTS (SELECT 1 FROM `+p+`key_versions WHERE consumer = $1 AND topic = ANY($2::text[]))`, consumer, topics).Scan(&stored)
	return stored, err
}

// renamedError is the *consumer.ConfigError on Options.Consumer for a
// consumer that most likely replaces another: why names the consumers tied
// to its topics, first is the first of them.
func (s *dbScope) renamedError(why []string, first string) *consumer.ConfigError {
	return &consumer.ConfigError{Struct: "dbscope.Options", Field: "Consumer", Reason: fmt.Sprintf(
		"is not set, so it is the group id %q, which has no row in the inbox, and the group has no committed offset on %s: the runner would start "+
			"from the reset offset (the earliest by default) and apply again every record that consumer %s applied and Kafka still holds, "+
			"since the inbox deduplicates per consumer. If group %q replaces %q (a renamed group), keep the group id %q if you can: "+
			"retry topics, the dead-letter topic and offsets are named by it, and the records %q left in its retry topics, with those parked "+
			"behind them, are handled only by a member of group %q. Otherwise set Consumer to %q, so that what it applied is not applied again. "+
			"If this is another pipeline that must apply these records too, set Consumer to %q",
		s.group, strings.Join(s.topics, ", "), strings.Join(why, ", consumer "), s.group, first, first, first, first, first, s.group)}
}
