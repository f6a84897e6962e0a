//! The unit tests of ultr-core and ultr-train: each library module's `tests` (compiled into the
//! library under its `unit-tests` feature, which `ultr`'s dev-dependencies turn on) run here, one
//! `#[test]` each, under the module path of the code they test. The libraries have no unit-test
//! build of their own (`test = false`): that build would compile each library a second time.
//! `every_library_unit_test_runs_here` fails when a library test has no line below.

mod ultr_core {
    mod context {
        #[test]
        fn two_contexts_in_one_process_keep_their_own_memory_limits_and_threads() {
            ::ultr_core::context::tests::two_contexts_in_one_process_keep_their_own_memory_limits_and_threads()
        }
    }
    mod identify {
        mod logged {
            #[test]
            fn a_right_log_has_dispersion_near_one_and_a_wrong_one_is_flagged() {
                ::ultr_core::identify::logged::tests::a_right_log_has_dispersion_near_one_and_a_wrong_one_is_flagged()
            }
        }
        mod overlap {
            #[test]
            fn auc_counts_ordered_pairs_with_ties_as_half() {
                ::ultr_core::identify::overlap::tests::auc_counts_ordered_pairs_with_ties_as_half()
            }
            #[test]
            fn cross_fitted_overlap_does_not_depend_on_the_dimension() {
                ::ultr_core::identify::overlap::tests::cross_fitted_overlap_does_not_depend_on_the_dimension()
            }
            #[test]
            fn mmd2_by_hand_zero_for_one_sample_twice_and_larger_for_a_shift() {
                ::ultr_core::identify::overlap::tests::mmd2_by_hand_zero_for_one_sample_twice_and_larger_for_a_shift()
            }
        }
        mod plan {
            #[test]
            fn move_probabilities_match_the_frequencies_of_applied_randomizations() {
                ::ultr_core::identify::plan::tests::move_probabilities_match_the_frequencies_of_applied_randomizations()
            }
            #[test]
            fn a_chain_variance_is_the_sum_of_its_links_inverse_informations() {
                ::ultr_core::identify::plan::tests::a_chain_variance_is_the_sum_of_its_links_inverse_informations()
            }
            #[test]
            fn one_link_needs_the_sessions_the_delta_method_gives() {
                ::ultr_core::identify::plan::tests::one_link_needs_the_sessions_the_delta_method_gives()
            }
            #[test]
            fn a_precise_position_needs_nothing_and_an_unreachable_one_is_none() {
                ::ultr_core::identify::plan::tests::a_precise_position_needs_nothing_and_an_unreachable_one_is_none()
            }
            #[test]
            fn bad_requests_name_the_field() {
                ::ultr_core::identify::plan::tests::bad_requests_name_the_field()
            }
        }
        mod policy {
            #[test]
            fn policy_variation_is_the_within_position_sd() {
                ::ultr_core::identify::policy::tests::policy_variation_is_the_within_position_sd()
            }
        }
        mod precision {
            #[test]
            fn standard_errors_match_the_spread_of_the_estimates_over_simulated_logs() {
                ::ultr_core::identify::precision::tests::standard_errors_match_the_spread_of_the_estimates_over_simulated_logs()
            }
            #[test]
            fn a_graph_held_by_a_few_pairs_is_imprecise_and_a_cut_position_is_unknown() {
                ::ultr_core::identify::precision::tests::a_graph_held_by_a_few_pairs_is_imprecise_and_a_cut_position_is_unknown()
            }
            #[test]
            fn with_two_positions_the_link_information_is_the_inverse_variance_of_theta_2() {
                ::ultr_core::identify::precision::tests::with_two_positions_the_link_information_is_the_inverse_variance_of_theta_2()
            }
        }
        #[test]
        fn swap_pair_counts_sum_contexts_and_skip_what_is_no_edge() {
            ::ultr_core::identify::tests::swap_pair_counts_sum_contexts_and_skip_what_is_no_edge()
        }
        #[test]
        fn spanning_bottleneck_is_the_largest_threshold_that_still_connects() {
            ::ultr_core::identify::tests::spanning_bottleneck_is_the_largest_threshold_that_still_connects()
        }
        #[test]
        fn two_positions_have_their_edge_as_bottleneck_and_one_has_none() {
            ::ultr_core::identify::tests::two_positions_have_their_edge_as_bottleneck_and_one_has_none()
        }
    }
    mod ingest {
        #[test]
        fn decoding_in_stretches_side_by_side_equals_decoding_in_order() {
            ::ultr_core::ingest::tests::decoding_in_stretches_side_by_side_equals_decoding_in_order()
        }
        #[test]
        fn the_guard_reference_never_steps_back_with_the_wall_clock() {
            ::ultr_core::ingest::tests::the_guard_reference_never_steps_back_with_the_wall_clock()
        }
    }
    mod pipeline {
        mod shards {
            #[test]
            fn the_reader_resumes_at_the_earliest_shard_and_reads_a_partition_one_shard_lacks_from_its_start() {
                ::ultr_core::pipeline::shards::tests::the_reader_resumes_at_the_earliest_shard_and_reads_a_partition_one_shard_lacks_from_its_start()
            }
            #[test]
            fn the_earliest_shard_has_read_the_fewest_records_and_the_first_among_equals_wins() {
                ::ultr_core::pipeline::shards::tests::the_earliest_shard_has_read_the_fewest_records_and_the_first_among_equals_wins()
            }
            #[test]
            fn every_shard_gets_a_share_of_the_queries() {
                ::ultr_core::pipeline::shards::tests::every_shard_gets_a_share_of_the_queries()
            }
            #[test]
            fn a_dead_letter_past_the_crash_point_does_not_uncover_the_sessions_before_it() {
                ::ultr_core::pipeline::shards::tests::a_dead_letter_past_the_crash_point_does_not_uncover_the_sessions_before_it()
            }
        }
    }
    mod progress {
        #[test]
        fn a_file_that_fits_the_sample_is_counted_exactly_and_a_longer_one_estimated() {
            ::ultr_core::progress::tests::a_file_that_fits_the_sample_is_counted_exactly_and_a_longer_one_estimated()
        }
    }
    mod scale_out {
        #[test]
        fn a_state_read_to_the_end_with_open_windows_is_not_finished() {
            ::ultr_core::scale_out::tests::a_state_read_to_the_end_with_open_windows_is_not_finished()
        }
    }
    mod session {
        mod codec {
            mod single_pass {
                #[test]
                fn records_of_the_usual_shape_take_the_single_pass() {
                    ::ultr_core::session::codec::single_pass_tests::records_of_the_usual_shape_take_the_single_pass()
                }
                #[test]
                fn leading_digits_counts_and_reads_the_digit_run_of_any_eight_bytes() {
                    ::ultr_core::session::codec::single_pass_tests::leading_digits_counts_and_reads_the_digit_run_of_any_eight_bytes()
                }
                #[test]
                fn numbers_match_serde_json_or_are_left_to_it() {
                    ::ultr_core::session::codec::single_pass_tests::numbers_match_serde_json_or_are_left_to_it()
                }
                #[test]
                fn to_f32_equals_the_division_rounded_to_f32() {
                    ::ultr_core::session::codec::single_pass_tests::to_f32_equals_the_division_rounded_to_f32()
                }
            }
        }
    }
    mod sources {
        mod click_log {
            #[test]
            fn a_click_goes_to_the_latest_page_that_showed_the_url() {
                ::ultr_core::sources::click_log::tests::a_click_goes_to_the_latest_page_that_showed_the_url()
            }
            #[test]
            fn bad_lines_are_refused_with_their_reason_and_the_rest_imports() {
                ::ultr_core::sources::click_log::tests::bad_lines_are_refused_with_their_reason_and_the_rest_imports()
            }
        }
        mod secrets {
            #[test]
            fn secrets_come_from_files_and_the_environment() {
                ::ultr_core::sources::secrets::tests::secrets_come_from_files_and_the_environment()
            }
        }
    }
    mod state {
        mod lease {
            #[test]
            fn an_unexpired_lease_is_refused_to_another_holder_and_names_its_holder_until_it_expires() {
                ::ultr_core::state::lease::tests::an_unexpired_lease_is_refused_to_another_holder_and_names_its_holder_until_it_expires()
            }
        }
        mod lock {
            #[test]
            fn a_second_writer_is_refused_until_the_first_releases() {
                ::ultr_core::state::lock::tests::a_second_writer_is_refused_until_the_first_releases()
            }
        }
        mod merged {
            #[test]
            fn compaction_follows_each_kind_of_change_in_a_part_and_writes_nothing_when_none_changed() {
                ::ultr_core::state::merged::tests::compaction_follows_each_kind_of_change_in_a_part_and_writes_nothing_when_none_changed()
            }
        }
        mod remote {
            #[test]
            fn list_names_every_object_under_a_folder_and_none_beside_it() {
                ::ultr_core::state::remote::tests::list_names_every_object_under_a_folder_and_none_beside_it()
            }
            #[test]
            fn a_fetch_downloads_only_changed_objects_and_leaves_the_copy_exactly() {
                ::ultr_core::state::remote::tests::a_fetch_downloads_only_changed_objects_and_leaves_the_copy_exactly()
            }
        }
        #[test]
        fn named_files_are_exactly_the_states_files_with_their_sizes() {
            ::ultr_core::state::tests::named_files_are_exactly_the_states_files_with_their_sizes()
        }
    }
    mod window {
        mod keys {
            #[test]
            fn strings_survive_the_round_trip_through_ids() {
                ::ultr_core::window::keys::tests::strings_survive_the_round_trip_through_ids()
            }
            #[test]
            fn a_second_string_for_a_known_id_is_an_error() {
                ::ultr_core::window::keys::tests::a_second_string_for_a_known_id_is_an_error()
            }
            #[test]
            fn an_id_the_window_does_not_know_is_an_error() {
                ::ultr_core::window::keys::tests::an_id_the_window_does_not_know_is_an_error()
            }
        }
        mod prepared {
            #[test]
            fn a_prepared_statement_equals_a_fresh_run_on_every_input() {
                ::ultr_core::window::prepared::tests::a_prepared_statement_equals_a_fresh_run_on_every_input()
            }
        }
        #[tokio::test]
        async fn every_entry_plans_and_its_order_names_its_columns() {
            ::ultr_core::window::tests::every_entry_plans_and_its_order_names_its_columns().await
        }
    }
}
mod ultr_train {
    mod baselines {
        #[test]
        fn bernoulli_log_likelihood_matches_a_hand_count() {
            ::ultr_train::baselines::tests::bernoulli_log_likelihood_matches_a_hand_count()
        }
        #[test]
        fn smoothed_rates_follow_the_stated_priors() {
            ::ultr_train::baselines::tests::smoothed_rates_follow_the_stated_priors()
        }
    }
    mod batches {
        #[test]
        fn the_visits_of_a_one_pass_epoch_take_every_row_exactly_once() {
            ::ultr_train::batches::tests::the_visits_of_a_one_pass_epoch_take_every_row_exactly_once()
        }
        #[test]
        fn sorted_galloping_draws_equal_binary_search() {
            ::ultr_train::batches::tests::sorted_galloping_draws_equal_binary_search()
        }
    }
    mod checkpoint {
        #[test]
        fn a_writer_removes_what_a_crashed_writer_left() {
            ::ultr_train::checkpoint::tests::a_writer_removes_what_a_crashed_writer_left()
        }
        #[test]
        fn a_candidate_below_the_position_only_model_is_rejected_even_when_forced() {
            ::ultr_train::checkpoint::tests::a_candidate_below_the_position_only_model_is_rejected_even_when_forced()
        }
        #[test]
        fn prune_keeps_the_newest_and_never_the_current_model() {
            ::ultr_train::checkpoint::tests::prune_keeps_the_newest_and_never_the_current_model()
        }
    }
    mod eval {
        mod judged {
            #[test]
            fn ndcg_follows_the_definition_by_hand() {
                ::ultr_train::eval::judged::tests::ndcg_follows_the_definition_by_hand()
            }
            #[test]
            fn ties_break_by_document_id_descending() {
                ::ultr_train::eval::judged::tests::ties_break_by_document_id_descending()
            }
            #[test]
            fn qrels_errors_name_the_file_and_line() {
                ::ultr_train::eval::judged::tests::qrels_errors_name_the_file_and_line()
            }
            #[test]
            fn a_ranking_equal_to_the_logged_order_ties_every_query_and_differs_by_zero() {
                ::ultr_train::eval::judged::tests::a_ranking_equal_to_the_logged_order_ties_every_query_and_differs_by_zero()
            }
        }
    }
    mod fit {
        #[test]
        fn a_fit_out_of_epochs_with_its_loss_still_falling_has_not_converged() {
            ::ultr_train::fit::tests::a_fit_out_of_epochs_with_its_loss_still_falling_has_not_converged()
        }
    }
    mod ips_propensity {
        #[test]
        fn each_policy_contributes_its_counted_or_logged_displays() {
            ::ultr_train::ips_propensity::tests::each_policy_contributes_its_counted_or_logged_displays()
        }
    }
    mod logged_order_combination {
        #[test]
        fn pool_adjacent_violators_matches_a_brute_force_non_increasing_fit() {
            ::ultr_train::logged_order_combination::tests::pool_adjacent_violators_matches_a_brute_force_non_increasing_fit()
        }
        #[test]
        fn the_endpoints_are_the_model_and_the_logged_order_and_kappa_weighs_by_information() {
            ::ultr_train::logged_order_combination::tests::the_endpoints_are_the_model_and_the_logged_order_and_kappa_weighs_by_information()
        }
    }
    mod logged_order_prior {
        #[test]
        fn the_prior_is_estimated_from_the_clicks_and_orders_rare_documents_by_it() {
            ::ultr_train::logged_order_prior::tests::the_prior_is_estimated_from_the_clicks_and_orders_rare_documents_by_it()
        }
        #[test]
        fn query_effects_take_up_the_query_level_and_order_documents_better() {
            ::ultr_train::logged_order_prior::tests::query_effects_take_up_the_query_level_and_order_documents_better()
        }
        #[test]
        fn the_non_increasing_projection_is_the_least_squares_one() {
            ::ultr_train::logged_order_prior::tests::the_non_increasing_projection_is_the_least_squares_one()
        }
        #[test]
        fn the_solution_zeroes_the_penalised_score_of_every_pair_and_bucket() {
            ::ultr_train::logged_order_prior::tests::the_solution_zeroes_the_penalised_score_of_every_pair_and_bucket()
        }
        #[test]
        fn one_standard_deviation_below_the_mean_ranks_a_clicked_pair_above_an_unseen_one() {
            ::ultr_train::logged_order_prior::tests::one_standard_deviation_below_the_mean_ranks_a_clicked_pair_above_an_unseen_one()
        }
    }
    mod misspecification {
        #[test]
        fn positions_pool_in_dyadic_blocks() {
            ::ultr_train::misspecification::tests::positions_pool_in_dyadic_blocks()
        }
        #[test]
        fn the_document_projection_subtracts_each_documents_weighted_mean() {
            ::ultr_train::misspecification::tests::the_document_projection_subtracts_each_documents_weighted_mean()
        }
    }
    mod models {
        mod gradient_reversal {
            #[test]
            fn the_setting_that_needs_labels_is_named_by_the_model_that_has_it() {
                ::ultr_train::models::gradient_reversal::tests::the_setting_that_needs_labels_is_named_by_the_model_that_has_it()
            }
        }
        mod tower {
            #[test]
            fn branch_free_elu_equals_burns_elu_and_its_gradient() {
                ::ultr_train::models::tower::tests::branch_free_elu_equals_burns_elu_and_its_gradient()
            }
        }
    }
    mod onnx {
        #[test]
        fn varints_encode_as_protobuf_does() {
            ::ultr_train::onnx::tests::varints_encode_as_protobuf_does()
        }
    }
    mod refit {
        #[test]
        fn every_model_says_whether_the_refit_applies_as_its_shift_does() {
            ::ultr_train::refit::tests::every_model_says_whether_the_refit_applies_as_its_shift_does()
        }
        #[test]
        fn the_refit_matches_expected_to_observed_clicks_at_every_position() {
            ::ultr_train::refit::tests::the_refit_matches_expected_to_observed_clicks_at_every_position()
        }
        #[test]
        fn the_profiled_refit_recovers_theta_from_shrunk_relevance_under_a_confounding_policy() {
            ::ultr_train::refit::tests::the_profiled_refit_recovers_theta_from_shrunk_relevance_under_a_confounding_policy()
        }
        #[test]
        fn a_position_whose_swap_pairs_carry_no_clicks_keeps_a_finite_theta_and_is_reported() {
            ::ultr_train::refit::tests::a_position_whose_swap_pairs_carry_no_clicks_keeps_a_finite_theta_and_is_reported()
        }
        #[test]
        fn a_position_without_swap_pairs_is_pooled_with_its_neighbours() {
            ::ultr_train::refit::tests::a_position_without_swap_pairs_is_pooled_with_its_neighbours()
        }
    }
    mod uncertainty {
        #[test]
        fn poisson_resampling_is_unbiased_per_row() {
            ::ultr_train::uncertainty::tests::poisson_resampling_is_unbiased_per_row()
        }
        #[test]
        fn t_quantiles_match_tables() {
            ::ultr_train::uncertainty::tests::t_quantiles_match_tables()
        }
        #[test]
        fn quantiles_interpolate() {
            ::ultr_train::uncertainty::tests::quantiles_interpolate()
        }
    }
}

/// Every public function of a library's `#[cfg(feature = "unit-tests")] pub mod tests` (the
/// libraries' unit tests; their helpers stay private) is called from this file, and this file
/// calls nothing else there: a test added to a library without its line here would never run.
#[test]
fn every_library_unit_test_runs_here() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let here = std::fs::read_to_string(root.join("tests/laboratory/units.rs")).unwrap();
    let (mut in_libraries, mut count) = (std::collections::BTreeSet::new(), 0);
    for krate in ["crates/core/src", "crates/train/src"] {
        let mut stack = vec![root.join(krate)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    // The tests module's header: compiled in under the feature, skipped by cargo-mutants
                    // (which reads `mutants::skip` whatever the condition; cfg(test) is never set for
                    // a library without a unit-test build).
                    let header = "#[cfg(feature = \"unit-tests\")]\n#[cfg_attr(test, mutants::skip)]\npub mod tests {";
                    let Some(start) = text.find(header) else {
                        assert!(!text.contains("unit-tests\")]\npub mod"), "{}: a tests module without the header", path.display());
                        continue;
                    };
                    for line in text[start..].lines() {
                        let name = line.strip_prefix("    pub fn ").or_else(|| line.strip_prefix("    pub async fn "));
                        if let Some(name) = name.and_then(|n| n.split('(').next()) {
                            in_libraries.insert(name.to_string());
                            count += 1;
                        }
                    }
                }
            }
        }
    }
    let called: std::collections::BTreeSet<String> = here
        .lines()
        .filter_map(|l| l.trim().strip_prefix("::ultr_"))
        .filter_map(|l| l.split("::").last())
        .map(|call| call.trim_end_matches(".await").trim_end_matches("()").to_string())
        .collect();
    assert!(in_libraries.len() >= 70, "found only {} library unit tests: is the scan still right?", in_libraries.len());
    assert_eq!(called, in_libraries, "library unit tests and the calls in tests/laboratory/units.rs differ");
    let wrappers = here.lines().filter(|l| matches!(l.trim(), "#[test]" | "#[tokio::test]")).count();
    assert_eq!(wrappers, count + 1, "one test here per library unit test, and this one");
}
