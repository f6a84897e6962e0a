//! The unit tests of ultr-core and ultr-train: each library module's `tests` (compiled into the
//! library under its `unit-tests` feature, which `ultr`'s dev-dependencies turn on) run here, one
//! `#[test]` each, under the module path of the code they test. The libraries have no unit-test
//! build of their own (`test = false`): that build would compile each library a second time.
//! `every_library_unit_test_runs_here` fails when a library test is not named below.

/// `#[test]`s that call the named functions of a library's `tests` module (`async`: `#[tokio::test]`s).
macro_rules! unit_tests {
    ($(::$segment:ident)+: $($name:ident),+ $(,)?) => {
        use $(::$segment)+ as library;
        $(
            #[test]
            fn $name() {
                library::$name()
            }
        )+
    };
    (async $(::$segment:ident)+: $($name:ident),+ $(,)?) => {
        use $(::$segment)+ as library;
        $(
            #[tokio::test]
            async fn $name() {
                library::$name().await
            }
        )+
    };
}

mod ultr_core {
    mod context {
        unit_tests!(::ultr_core::context::tests:
            two_contexts_in_one_process_keep_their_own_memory_limits_and_threads,
        );
    }
    mod identify {
        mod logged {
            unit_tests!(::ultr_core::identify::logged::tests:
                a_right_log_has_dispersion_near_one_and_a_wrong_one_is_flagged,
            );
        }
        mod overlap {
            unit_tests!(::ultr_core::identify::overlap::tests:
                auc_counts_ordered_pairs_with_ties_as_half,
                cross_fitted_overlap_does_not_depend_on_the_dimension,
                mmd2_by_hand_zero_for_one_sample_twice_and_larger_for_a_shift,
            );
        }
        mod plan {
            unit_tests!(::ultr_core::identify::plan::tests:
                move_probabilities_match_the_frequencies_of_applied_randomizations,
                a_chain_variance_is_the_sum_of_its_links_inverse_informations,
                one_link_needs_the_sessions_the_delta_method_gives,
                a_precise_position_needs_nothing_and_an_unreachable_one_is_none,
                bad_requests_name_the_field,
            );
        }
        mod policy {
            unit_tests!(::ultr_core::identify::policy::tests:
                policy_variation_is_the_within_position_sd,
            );
        }
        mod precision {
            unit_tests!(::ultr_core::identify::precision::tests:
                standard_errors_match_the_spread_of_the_estimates_over_simulated_logs,
                a_graph_held_by_a_few_pairs_is_imprecise_and_a_cut_position_is_unknown,
                with_two_positions_the_link_information_is_the_inverse_variance_of_theta_2,
            );
        }
        unit_tests!(::ultr_core::identify::tests:
            swap_pair_counts_sum_contexts_and_skip_what_is_no_edge,
            spanning_bottleneck_is_the_largest_threshold_that_still_connects,
            two_positions_have_their_edge_as_bottleneck_and_one_has_none,
        );
    }
    mod ingest {
        unit_tests!(::ultr_core::ingest::tests:
            decoding_in_stretches_side_by_side_equals_decoding_in_order,
            the_guard_reference_never_steps_back_with_the_wall_clock,
        );
    }
    mod pipeline {
        mod shards {
            unit_tests!(::ultr_core::pipeline::shards::tests:
                the_reader_resumes_at_the_earliest_shard_and_reads_a_partition_one_shard_lacks_from_its_start,
                the_earliest_shard_has_read_the_fewest_records_and_the_first_among_equals_wins,
                every_shard_gets_a_share_of_the_queries,
                a_dead_letter_past_the_crash_point_does_not_uncover_the_sessions_before_it,
            );
        }
    }
    mod progress {
        unit_tests!(::ultr_core::progress::tests:
            a_file_that_fits_the_sample_is_counted_exactly_and_a_longer_one_estimated,
        );
    }
    mod scale_out {
        unit_tests!(::ultr_core::scale_out::tests:
            a_state_read_to_the_end_with_open_windows_is_not_finished,
        );
    }
    mod session {
        mod null_run {
            unit_tests!(::ultr_core::session::null_run_tests:
                null_runs_give_the_array_of_rows_appended_one_at_a_time,
            );
        }
        mod text_column {
            unit_tests!(::ultr_core::session::text_column_tests:
                pushes_give_the_array_arrows_builder_gives_one_value_at_a_time,
            );
        }
        mod codec {
            mod single_pass {
                unit_tests!(::ultr_core::session::codec::single_pass_tests:
                    records_of_the_usual_shape_take_the_single_pass,
                    leading_digits_counts_and_reads_the_digit_run_of_any_eight_bytes,
                    numbers_match_serde_json_or_are_left_to_it,
                    to_f32_equals_the_division_rounded_to_f32,
                );
            }
            mod wire {
                unit_tests!(::ultr_core::session::codec::wire_tests:
                    utf8_accepts_exactly_what_str_from_utf8_accepts,
                );
            }
        }
    }
    mod sources {
        mod click_log {
            unit_tests!(::ultr_core::sources::click_log::tests:
                a_click_goes_to_the_latest_page_that_showed_the_url,
                bad_lines_are_refused_with_their_reason_and_the_rest_imports,
            );
        }
        mod secrets {
            unit_tests!(::ultr_core::sources::secrets::tests:
                secrets_come_from_files_and_the_environment,
            );
        }
    }
    mod state {
        mod lease {
            unit_tests!(::ultr_core::state::lease::tests:
                an_unexpired_lease_is_refused_to_another_holder_and_names_its_holder_until_it_expires,
            );
        }
        mod lock {
            unit_tests!(::ultr_core::state::lock::tests:
                a_second_writer_is_refused_until_the_first_releases,
            );
        }
        mod merged {
            unit_tests!(::ultr_core::state::merged::tests:
                compaction_follows_each_kind_of_change_in_a_part_and_writes_nothing_when_none_changed,
            );
        }
        mod remote {
            unit_tests!(::ultr_core::state::remote::tests:
                list_names_every_object_under_a_folder_and_none_beside_it,
                a_fetch_downloads_only_changed_objects_and_leaves_the_copy_exactly,
            );
        }
        unit_tests!(::ultr_core::state::tests:
            named_files_are_exactly_the_states_files_with_their_sizes,
        );
    }
    mod window {
        mod keys {
            unit_tests!(::ultr_core::window::keys::tests:
                strings_survive_the_round_trip_through_ids,
                a_second_string_for_a_known_id_is_an_error,
                an_id_the_window_does_not_know_is_an_error,
            );
        }
        mod prepared {
            unit_tests!(::ultr_core::window::prepared::tests:
                a_prepared_statement_equals_a_fresh_run_on_every_input,
            );
        }
        unit_tests!(async ::ultr_core::window::tests:
            every_entry_plans_and_its_order_names_its_columns,
        );
    }
}
mod ultr_train {
    mod baselines {
        unit_tests!(::ultr_train::baselines::tests:
            bernoulli_log_likelihood_matches_a_hand_count,
            smoothed_rates_follow_the_stated_priors,
        );
    }
    mod batches {
        unit_tests!(::ultr_train::batches::tests:
            the_visits_of_a_one_pass_epoch_take_every_row_exactly_once,
            sorted_galloping_draws_equal_binary_search,
        );
    }
    mod checkpoint {
        unit_tests!(::ultr_train::checkpoint::tests:
            a_writer_removes_what_a_crashed_writer_left,
            a_candidate_below_the_position_only_model_is_rejected_even_when_forced,
            prune_keeps_the_newest_and_never_the_current_model,
        );
    }
    mod eval {
        mod judged {
            unit_tests!(::ultr_train::eval::judged::tests:
                ndcg_follows_the_definition_by_hand,
                ties_break_by_document_id_descending,
                qrels_errors_name_the_file_and_line,
                a_ranking_equal_to_the_logged_order_ties_every_query_and_differs_by_zero,
            );
        }
    }
    mod fit {
        unit_tests!(::ultr_train::fit::tests:
            a_fit_out_of_epochs_with_its_loss_still_falling_has_not_converged,
        );
    }
    mod ips_propensity {
        unit_tests!(::ultr_train::ips_propensity::tests:
            each_policy_contributes_its_counted_or_logged_displays,
        );
    }
    mod logged_order_combination {
        unit_tests!(::ultr_train::logged_order_combination::tests:
            pool_adjacent_violators_matches_a_brute_force_non_increasing_fit,
            the_endpoints_are_the_model_and_the_logged_order_and_kappa_weighs_by_information,
        );
    }
    mod logged_order_prior {
        unit_tests!(::ultr_train::logged_order_prior::tests:
            the_prior_is_estimated_from_the_clicks_and_orders_rare_documents_by_it,
            query_effects_take_up_the_query_level_and_order_documents_better,
            the_non_increasing_projection_is_the_least_squares_one,
            the_solution_zeroes_the_penalised_score_of_every_pair_and_bucket,
            one_standard_deviation_below_the_mean_ranks_a_clicked_pair_above_an_unseen_one,
        );
    }
    mod misspecification {
        unit_tests!(::ultr_train::misspecification::tests:
            positions_pool_in_dyadic_blocks,
            the_document_projection_subtracts_each_documents_weighted_mean,
        );
    }
    mod models {
        mod gradient_reversal {
            unit_tests!(::ultr_train::models::gradient_reversal::tests:
                the_setting_that_needs_labels_is_named_by_the_model_that_has_it,
            );
        }
        mod tower {
            unit_tests!(::ultr_train::models::tower::tests:
                branch_free_elu_equals_burns_elu_and_its_gradient,
            );
        }
    }
    mod onnx {
        unit_tests!(::ultr_train::onnx::tests:
            varints_encode_as_protobuf_does,
        );
    }
    mod refit {
        unit_tests!(::ultr_train::refit::tests:
            every_model_says_whether_the_refit_applies_as_its_shift_does,
            the_refit_matches_expected_to_observed_clicks_at_every_position,
            the_profiled_refit_recovers_theta_from_shrunk_relevance_under_a_confounding_policy,
            the_pairwise_conditional_estimate_recovers_theta_under_a_confounding_policy,
            the_pairwise_conditional_estimate_is_the_two_position_optimum_of_the_couples,
            the_pairwise_conditional_estimate_has_no_incidental_parameter_bias_on_pairs_of_few_impressions,
            a_position_whose_swap_pairs_carry_no_clicks_keeps_a_finite_theta_and_is_reported,
            a_position_without_swap_pairs_is_pooled_with_its_neighbours,
        );
    }
    mod uncertainty {
        unit_tests!(::ultr_train::uncertainty::tests:
            poisson_resampling_is_unbiased_per_row,
            t_quantiles_match_tables,
            quantiles_interpolate,
        );
    }
}

/// Every public function of a library's `#[cfg(feature = "unit-tests")] pub mod tests` (the
/// libraries' unit tests; their helpers stay private) is named in an invocation above, and nothing
/// else is: a test added to a library without its name here would never run.
#[test]
fn every_library_unit_test_runs_here() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut in_libraries = Vec::new();
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
                            in_libraries.push(name.to_string());
                        }
                    }
                }
            }
        }
    }
    // The names inside this file's invocations (everything between `unit_tests!(…:` and `);`).
    let here = std::fs::read_to_string(root.join("tests/laboratory/units.rs")).unwrap();
    let mut named = Vec::new();
    for invocation in here.split("unit_tests!(").skip(1).filter(|s| s.trim_start().starts_with("::") || s.trim_start().starts_with("async ::")) {
        // The path ends in `tests` (or `single_pass_tests`), then `:` and the names.
        let list = &invocation[invocation.find("tests:").unwrap() + "tests:".len()..];
        let list = list.split(");").next().unwrap();
        named.extend(list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from));
    }
    in_libraries.sort();
    named.sort();
    assert!(in_libraries.len() >= 70, "found only {} library unit tests: is the scan still right?", in_libraries.len());
    assert_eq!(named, in_libraries, "library unit tests and the names in tests/laboratory/units.rs differ");
}
