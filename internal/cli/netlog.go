package cli

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"text/tabwriter"

	"github.com/airlock/airlock/internal/api/apitypes"
)

// networkLog is `airlock sandbox network log <id> [--after N] [--limit N]
// [--json]`: one page of the sandbox's egress decisions.
func networkLog(ctx context.Context, r *runner, id string, after int64, limit int, asJSON bool) error {
	if after < 0 {
		return usagef("sandbox network", "--after %d: want 0 (from the start) or the next of an earlier page", after)
	}
	if limit < 0 {
		return usagef("sandbox network", "--limit %d: want 1 to 1000 (0: 1000)", limit)
	}
	c, err := r.client()
	if err != nil {
		return err
	}
	lg, err := c.NetworkLog(ctx, id, after, limit)
	if err != nil {
		return fmt.Errorf("network log of %s: %w", id, err)
	}
	if asJSON {
		return printJSON(r.stdout, lg)
	}
	printNetworkLog(r, lg)
	if lg.Note != "" {
		fmt.Fprintln(r.stderr, "note:", lg.Note)
	}
	if lg.Reset {
		fmt.Fprintf(r.stderr, "note: the log began again since --after %d (its worker restarted, or the sandbox moved); shown from its start\n", after)
	}
	if lg.Missed > 0 {
		fmt.Fprintf(r.stderr, "note: %d earlier entries are no longer kept (the log holds the last 1000)\n", lg.Missed)
	}
	if limit > 0 && len(lg.Entries) == limit {
		fmt.Fprintf(r.stderr, "more: airlock sandbox network log %s --after %d\n", id, lg.Next)
	}
	return nil
}

func printNetworkLog(r *runner, lg apitypes.NetworkLogResponse) {
	if len(lg.Entries) == 0 {
		if lg.Note == "" {
			fmt.Fprintln(r.stdout, "no egress decisions recorded")
		}
		return
	}
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tDECISION\tNAME\tADDRESS\tRULE\tCODE\tREASON")
	for _, e := range lg.Entries {
		addr := e.IP
		if e.Port != 0 {
			addr = net.JoinHostPort(e.IP, strconv.Itoa(int(e.Port)))
		}
		name := e.Name
		if name == "" {
			name = "-"
		}
		if addr == "" {
			addr = "-"
		}
		rule := "-"
		if e.Rule >= 0 {
			rule = strconv.Itoa(e.Rule)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Local().Format("15:04:05.000"), e.Kind, e.Decision, name, addr, rule, e.Code, e.Reason)
	}
	tw.Flush()
}
