package agentclient

import "time"

// SetReadyAttempt changes how long one WaitReady attempt may take, for the
// duration of a test.
func SetReadyAttempt(d time.Duration) (restore func()) {
	old := readyAttempt
	readyAttempt = d
	return func() { readyAttempt = old }
}
