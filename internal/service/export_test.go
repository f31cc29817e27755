package service

import "github.com/airlock/airlock/internal/store"

// TestStore is the service's store, for the tests of package service_test
// that set up rows the API has no call for.
func (s *Service) TestStore() store.Store { return s.st }

// TestWith is a new service over the same store and event log, with cfg
// changed by f.
func (s *Service) TestWith(f func(*Config)) *Service {
	cfg := s.cfg
	f(&cfg)
	return New(cfg)
}
