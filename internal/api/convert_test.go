package api

import (
	"testing"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/service"
)

// TestWireLimitsMatchService: the limits /v1 documents are the service's.
func TestWireLimitsMatchService(t *testing.T) {
	if apitypes.MaxForks != service.MaxForks {
		t.Errorf("apitypes.MaxForks = %d, service.MaxForks = %d", apitypes.MaxForks, service.MaxForks)
	}
}
