package dbscope

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
)

// checkTablePrefix is Start's check for a consumer with no row in the
// tables of its table prefix (consumerKnown): when the tables of another
// prefix in the search path hold its rows, Options.TablePrefix most likely
// changed between two deployments. Records parked or waiting there had
// their offsets committed, and no runner on this prefix would ever apply
// or dead-letter them: it returns a *consumer.ConfigError on TablePrefix
// that counts them and says what to do. When the other prefix holds only
// the consumer's inbox rows it logs a warning: a replay or a redelivery of
// what they deduplicated would be applied again. A lookup that fails is
// returned as err, which Start logs.
func (s *dbScope) checkTablePrefix(ctx context.Context) (*consumer.ConfigError, error) {
	ctx, cancel := context.WithTimeout(ctx, consumerCheckTimeout)
	defer cancel()
	// Every prefix Migrate ran with has its schema_migrations table.
	rows, err := s.o.Pool.Query(ctx, `SELECT left(c.relname, length(c.relname) - length('schema_migrations'))
		FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname = ANY(current_schemas(false)) AND c.relname LIKE '%schema\_migrations'
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	prefixes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, p := range prefixes {
		if p == s.o.TablePrefix || validPrefix(p) != nil {
			continue
		}
		var complete bool
		if err := s.o.Pool.QueryRow(ctx, `SELECT bool_and(to_regclass(t) IS NOT NULL) FROM unnest($1::text[]) AS t`,
			[]string{p + "inbox", p + "offsets", p + "parked", p + "waiting", p + "key_versions"}).Scan(&complete); err != nil {
			return nil, err
		}
		if !complete {
			continue // tables of an older kscope, or not kscope's
		}
		known, err := hasConsumerRows(ctx, s.o.Pool, p, s.o.Consumer)
		if err != nil {
			return nil, err
		}
		if !known {
			continue
		}
		var parked, waiting int64
		if err := s.o.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+p+`parked WHERE consumer = $1), (SELECT count(*) FROM `+p+`waiting WHERE consumer = $1)`,
			s.o.Consumer).Scan(&parked, &waiting); err != nil {
			return nil, err
		}
		if parked+waiting == 0 {
			s.log.Warn("kscope: the tables of another table prefix hold this consumer's inbox and none of this prefix does: records they deduplicate "+
				"(a redelivery, a replay) are applied again. If TablePrefix changed between two deployments, set it back",
				"consumer", s.o.Consumer, "table_prefix", s.o.TablePrefix, "other_table_prefix", p)
			continue
		}
		return &consumer.ConfigError{Struct: "dbscope.Options", Field: "TablePrefix", Reason: fmt.Sprintf(
			"is %q, whose tables have no row of consumer %q, while the tables of prefix %q hold its inbox, %d records in the retry topics (%sparked) "+
				"and %d records waiting behind them (%swaiting, their offsets committed): a runner on %q would never apply or dead-letter the waiting "+
				"ones, and would apply again what %sinbox deduplicates. Set TablePrefix back to %q; to move to %q, first run on %q until no record is "+
				"parked or waiting (with Config.Failures.DisableRetryTopics no new key is parked)",
			s.o.TablePrefix, s.o.Consumer, p, parked, p, waiting, p, s.o.TablePrefix, p, p, s.o.TablePrefix, p)}, nil
	}
	return nil, nil
}
